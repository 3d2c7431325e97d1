"""Seeded bad-input cases: generated replay cases with one to three inputs spoiled.

Usage: python scripts/refusal_fuzz.py --out DIR [--seed N] [--count K] [--record] [--timeout S] [--odd]

Case ``i`` of family ``N`` is ``mocker-spec gen-cases --seed N`` case ``i`` (a plain, session or
concurrency variant, drawn per case), with 1-3 spoiled inputs drawn from a stream of its own:

- an engine argument (top level or an ``sglang`` member) set to a wrong value: 0, -1, a float, a
  string, ``null``, a boolean, a list, an object, an out-of-range number, an unknown key;
- a replay argument (worker counts, ``router_mode``, ``trace_block_size``, ``replay_concurrency``,
  ``arrival_speedup_ratio``, ``max_sim_time_ms``, an SLA threshold, ``trace_format``) set likewise;
- a trace row: one field set to a wrong value or dropped, or the whole line replaced (text that
  is not JSON, a JSON array, a number, a blank line);
- about one case in four is a CLI job (``from_cli``: the JSON dialect of the engine arguments,
  every worker count passed, spec/replay.md DRV-19).

With ``--odd`` the values are of the right type but at the edges of what is accepted, or just past
them (a block size of 3 or 2048, one GPU block, a zero speed-up or bandwidth, a huge timestamp, an
empty hash list, an output length of 0, ...): cases that run, dead-end, hang or are refused late.

The cases are written in the refcases layout (``case.json`` also keeps the mutations applied, under
``"spoiled"``, which the runners ignore), with ``--record`` also the compiled reference's outcome, so
``mocker-spec diff --corpus DIR`` compares the model's refusals with the build's (spec/fidelity.md
FID-10, FID-11). Each case is a pure function of ``(seed, index)``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mocker_spec.casegen import generate_case  # noqa: E402

#: engine arguments worth spoiling (the ones the generated cases set, and a few more)
ENGINE_KEYS = ("engine_type", "num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
               "enable_prefix_caching", "enable_chunked_prefill", "speedup_ratio", "decode_speedup_ratio",
               "dp_size", "startup_time", "worker_type", "preemption_mode", "kv_transfer_bandwidth",
               "kv_bytes_per_token", "kv_transfer_timing_mode", "router_queue_policy", "aic_tp_size",
               "handoff_session_timeout_ms", "gpu_memory_utilization", "sglang", "trtllm", "reasoning")
SGLANG_KEYS = ("schedule_policy", "page_size", "max_prefill_tokens", "chunked_prefill_size",
               "clip_max_new_tokens", "schedule_conservativeness")
REPLAY_KEYS = ("num_workers", "num_prefill_workers", "num_decode_workers", "router_mode", "trace_block_size",
               "replay_concurrency", "arrival_speedup_ratio", "max_sim_time_ms", "sla_ttft_ms", "sla_itl_ms",
               "sla_e2e_ms", "trace_format")
ROW_KEYS = ("timestamp", "input_length", "output_length", "hash_ids", "session_id", "delay", "priority",
            "created_time", "input_tokens")
#: JSON-representable wrong values (no NaN: the refcases files are strict JSON)
BAD_VALUES: Tuple[Any, ...] = (0, -1, 1.5, -0.5, "x", "VLLM", None, True, False, [1], {}, [], 2 ** 64, 1e300, "")
BAD_LINES = ("{bad", "[1, 2]", "7", "   ", "null", '{"timestamp": 1}', "[]")
#: --odd: values of the right type at the edges of what is accepted (or just past them)
ODD_ENGINE = {
    "block_size": (1, 2, 3, 12, 64, 1024, 2048), "num_gpu_blocks": (1, 2, 3), "max_num_seqs": (1, 2),
    "max_num_batched_tokens": (1, 2, 7), "speedup_ratio": (0.0, 1e-9, 1e9), "decode_speedup_ratio": (0.0, 1e9),
    "enable_prefix_caching": (False,), "enable_chunked_prefill": (False,), "preemption_mode": ("fifo",),
    "kv_transfer_bandwidth": (0.0, 1e-9), "kv_bytes_per_token": (0, 1, 10 ** 12), "startup_time": (0.0, 1e9),
    "kv_transfer_timing_mode": ("destination_missing",), "router_queue_policy": ("lcfs", "wspt"),
    "aic_tp_size": (0, 8), "aic_attention_dp_size": (0, 8),
}
ODD_SGLANG = {"page_size": (1, 3, 64), "max_prefill_tokens": (1, 2, 64), "chunked_prefill_size": (1, 4, 8),
              "clip_max_new_tokens": (1, 2), "schedule_conservativeness": (0.0, 1.0, 0.3),
              "schedule_policy": ("lpm", "fcfs", "LPM")}
ODD_REPLAY = {"num_workers": (1, 5), "num_prefill_workers": (1, 4), "num_decode_workers": (1, 4),
              "arrival_speedup_ratio": (1e-6, 1e6, 0.001), "replay_concurrency": (1, 2, 50),
              "max_sim_time_ms": (0.0, 1.0, 100.0), "sla_ttft_ms": (0.0, 1.0), "sla_itl_ms": (0.0,),
              "sla_e2e_ms": (0.0, 1e9), "trace_block_size": (1, 7, 1024)}
ODD_ROW = {"timestamp": (0.0, -1e9, 1e12, 0.1), "input_length": (0, 1, 100000), "output_length": (0, 1, 2000),
           "hash_ids": ([], [0], [2 ** 64 - 1], [1, 1, 1]), "session_id": ("s0", "s1", ""),
           "delay": (0.0, 1e6, 0.001)}


def spoil(seed: int, index: int, odd: bool = False) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """Case ``index`` of family ``seed``: ``(case.json content, trace lines, mutations)``; ``odd``
    draws edge values of the right type instead (a stream of its own)."""
    if odd:
        return _odd(seed, index)
    rng = random.Random(f"mocker-spec-refusal-fuzz:{seed}:{index}")
    variant = rng.choice(({}, {"sessions": True}, {"concurrency": True}, {"extra_args": True}))
    case, rows = generate_case(seed, index, **variant)
    lines = [json.dumps(r) for r in rows]
    done: List[str] = []
    if rng.random() < 0.25:
        case["from_cli"] = True
        done.append("from_cli")
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("engine", "engine", "replay", "row", "row"))
        value = rng.choice(BAD_VALUES)
        if kind == "engine":
            pools = [k for k in ("engine_args", "prefill_engine_args", "decode_engine_args") if k in case]
            pool = case[rng.choice(pools)]
            if rng.random() < 0.25:
                sub = pool.setdefault("sglang", {}) if isinstance(pool.get("sglang", {}), dict) else None
                if sub is not None:
                    key = rng.choice(SGLANG_KEYS)
                    sub[key] = value
                    done.append(f"engine sglang.{key}={value!r}")
                    continue
            key = rng.choice(ENGINE_KEYS + ("no_such_arg",))
            pool[key] = value
            done.append(f"engine {key}={value!r}")
        elif kind == "replay":
            key = rng.choice(REPLAY_KEYS)
            case[key] = value
            done.append(f"replay {key}={value!r}")
        else:
            n = rng.randrange(len(lines))
            if rng.random() < 0.3:
                lines[n] = rng.choice(BAD_LINES)
                done.append(f"line {n + 1} replaced")
                continue
            try:  # a line an earlier mutation replaced may not be an object any more
                row = json.loads(lines[n])
            except ValueError:
                row = {}
            if not isinstance(row, dict):
                row = {}
            key = rng.choice(ROW_KEYS)
            if rng.random() < 0.3:
                row.pop(key, None)
                done.append(f"line {n + 1} drops {key}")
            else:
                row[key] = value
                done.append(f"line {n + 1} {key}={value!r}")
            lines[n] = json.dumps(row)
    case["spoiled"] = done
    return case, lines, done


def _odd(seed: int, index: int) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """``spoil(..., odd=True)``: one to three edge values of the right type."""
    rng = random.Random(f"mocker-spec-refusal-fuzz-odd:{seed}:{index}")
    variant = rng.choice(({}, {"sessions": True}, {"concurrency": True}, {"extra_args": True}))
    case, rows = generate_case(seed, index, **variant)
    done: List[str] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(("engine", "engine", "sglang", "replay", "row", "row"))
        if kind in ("engine", "sglang"):
            pools = [k for k in ("engine_args", "prefill_engine_args", "decode_engine_args") if k in case]
            pool_name = rng.choice(pools)
            pool = case[pool_name]
            if kind == "sglang":
                key = rng.choice(sorted(ODD_SGLANG))
                value = rng.choice(ODD_SGLANG[key])
                pool.setdefault("sglang", {})[key] = value
                done.append(f"{pool_name} sglang.{key}={value!r}")
            else:
                key = rng.choice(sorted(ODD_ENGINE))
                value = rng.choice(ODD_ENGINE[key])
                pool[key] = value
                done.append(f"{pool_name} {key}={value!r}")
        elif kind == "replay":
            key = rng.choice(sorted(ODD_REPLAY))
            value = rng.choice(ODD_REPLAY[key])
            case[key] = value
            done.append(f"replay {key}={value!r}")
        else:
            n = rng.randrange(len(rows))
            key = rng.choice(sorted(ODD_ROW))
            value = rng.choice(ODD_ROW[key])
            rows[n][key] = value
            done.append(f"line {n + 1} {key}={value!r}")
    case["spoiled"] = done
    return case, [json.dumps(r) for r in rows], done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory to write the case directories into")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--record", action="store_true", help="also record the compiled reference's outcome")
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--odd", action="store_true", help="edge values of the right type instead (odd-* cases)")
    ns = ap.parse_args(argv)
    from mocker_spec.formats import atomic_write_text
    from mocker_spec.reference import record_case

    out = Path(ns.out)
    for index in range(ns.start, ns.start + ns.count):
        case, lines, done = spoil(ns.seed, index, odd=ns.odd)
        d = out / f"{'odd' if ns.odd else 'bad'}-{ns.seed}-{index:04d}"
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "case.json", json.dumps(case, indent=1, sort_keys=True))
        atomic_write_text(d / "trace.jsonl", "".join(line + "\n" for line in lines))
        status = record_case(d, timeout_s=ns.timeout) if ns.record else "-"
        print(f"{d.name}: {'; '.join(done)} -> {status[:100]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
