"""Seeded bad-input cases: generated replay cases with one to three inputs spoiled.

Usage: python scripts/refusal_fuzz.py --out DIR [--seed N] [--count K] [--record] [--timeout S] [--odd | --text]

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

With ``--text`` the trace's text itself is spoiled where serde_json and Python's ``json`` read JSON
differently (spec/replay.md WL-1..WL-3): repeated keys, ``-0``, long fractions and exponents, escaped
surrogates, odd blank lines, CRLF endings, invalid UTF-8, integers written as floats or past u64,
rows as arrays, the compiled build's ``request_id`` / ``output_token_ids`` (never a replay of
output tokens, which the model refuses as outside it, FID-6); and CLI jobs get engine-argument
floats of 17 significant digits (ARGS-13).

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


def _base_case(stream: str, seed: int, index: int):
    """The draw stream ``stream`` of case ``(seed, index)`` and the generated case it spoils: a
    plain, session, concurrency or extra-args variant of ``gen-cases`` case ``index`` of family
    ``seed``, drawn from that stream."""
    rng = random.Random(f"{stream}:{seed}:{index}")
    variant = rng.choice(({}, {"sessions": True}, {"concurrency": True}, {"extra_args": True}))
    case, rows = generate_case(seed, index, **variant)
    return rng, case, rows


def spoil(seed: int, index: int, odd: bool = False) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """Case ``index`` of family ``seed``: ``(case.json content, trace lines, mutations)``; ``odd``
    draws edge values of the right type instead (a stream of its own)."""
    if odd:
        return _odd(seed, index)
    rng, case, rows = _base_case("mocker-spec-refusal-fuzz", seed, index)
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
    rng, case, rows = _base_case("mocker-spec-refusal-fuzz-odd", seed, index)
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


#: --text: blank lines as Rust's str::trim sees them, or not (U+001C is not white space there)
TEXT_BLANKS = ("", "\t \t", "\u3000", "\x85", "\x1c", "\u2028")
#: --text: how a timestamp may be written (value kept or near it)
TEXT_ROW_FIELDS = ("input_length", "output_length", "timestamp")


def _text(seed: int, index: int) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """``--text``: one or two spoils of the trace's text (lines are ``str``; invalid UTF-8 is held as
    surrogate escapes, written back as the raw bytes)."""
    rng, case, rows = _base_case("mocker-spec-refusal-fuzz-text", seed, index)
    lines = [json.dumps(r) for r in rows]
    done: List[str] = []
    if rng.random() < 0.25:
        case["from_cli"] = True
        pools = [k for k in ("engine_args", "prefill_engine_args", "decode_engine_args") if k in case]
        pool = rng.choice(pools)
        key = "kv_transfer_bandwidth" if "kv_transfer_bandwidth" in case[pool] and rng.random() < 0.5 \
            else "speedup_ratio"
        value = case[pool].get(key, 1.0) * rng.uniform(0.5, 2.0)  # 17 significant digits, mostly
        case[pool][key] = value
        done.append(f"from_cli {pool}.{key}={value!r}")
    for _ in range(rng.randint(1, 2)):
        n = rng.randrange(len(lines))
        text = lines[n]
        obj = text.startswith("{") and text.endswith("}")
        kind = rng.choice(("dup-unknown", "dup-field", "minus-zero", "long-fraction", "exponent", "surrogate",
                           "pair", "blank", "crlf", "bad-utf8", "request-id", "token-ids", "array", "number"))
        if kind in ("blank", "crlf", "bad-utf8", "array") or not obj:
            if kind == "blank":
                blank = rng.choice(TEXT_BLANKS)
                lines.insert(n, blank)
                done.append(f"blank line {n + 1} {blank!r}")
            elif kind == "crlf":
                lines[n] = text + "\r"
                done.append(f"line {n + 1} ends with CRLF")
            elif kind == "bad-utf8":
                lines[n] = text[:-1] + ', "zz": "\udcff"}' if obj and rng.random() < 0.5 else "\udcff\udcfe"
                done.append(f"line {n + 1} holds invalid UTF-8")
            else:
                row = json.loads(text) if obj else {}
                fields = ("request_id", "session_id", "input_length", "output_length", "output_token_ids",
                          "hash_ids", "timestamp", "delay", "priority", "strict_priority", "policy_class")
                values = [row.get(f) for f in fields]
                while values and values[-1] is None:
                    values.pop()
                lines[n] = json.dumps(values)
                done.append(f"line {n + 1} as an array")
            continue
        row = json.loads(text)
        body = text[1:-1]
        if kind == "dup-unknown":
            lines[n] = '{"zz": 1, "zz": {"k": 1, "k": "\\ud800"}, ' + body + "}"
        elif kind == "dup-field":
            field = rng.choice(("input_length", "input_tokens", "output_tokens", "timestamp", "created_time"))
            lines[n] = "{" + body + f', "{field}": 3' + "}"
        elif kind == "minus-zero":
            field = rng.choice(TEXT_ROW_FIELDS)
            row[field] = "@"
            lines[n] = json.dumps(row).replace('"@"', rng.choice(("-0", "-0.0", "0e5")))
        elif kind == "long-fraction":
            row["timestamp"] = float(row.get("timestamp") or 0.0) + rng.random()
            lines[n] = json.dumps(row)
        elif kind == "exponent":
            ts = float(row.get("timestamp") or 0.0)
            row["timestamp"] = "@"
            lines[n] = json.dumps(row).replace('"@"', rng.choice((f"{ts:e}", f"{ts * 1000:.3f}e-3", f"{ts:E}")))
        elif kind in ("surrogate", "pair"):
            escaped = "\\ud83d\\ude00" if kind == "pair" else rng.choice(("\\ud800", "\\udc00", "a\\ud800b"))
            where = rng.choice(("session_id", "policy_class", "unknown value", "key"))
            if where == "key":
                lines[n] = '{"' + escaped + '": 1, ' + body + "}"
            elif where == "unknown value":
                lines[n] = '{"zz": "' + escaped + '", ' + body + "}"
            else:
                row[where] = "@"
                lines[n] = json.dumps(row).replace('"@"', '"' + escaped + '"')
        elif kind == "request-id":
            row["request_id"] = rng.choice(("r1", 5, None, ""))
            lines[n] = json.dumps(row)
        elif kind == "token-ids":
            out = int(row.get("output_length") or 0)
            if out >= 2**63:  # an earlier spoil wrote the length past u64, which already spoils the line
                out = 1       # (seed 463, case 267); the lists below cannot be that long
            row["output_token_ids"] = rng.choice(([1] * (out + 1), [-1] * max(out, 1), "x", None, [2**32] * out))
            if isinstance(row["output_token_ids"], list) and len(row["output_token_ids"]) == out and out and \
                    row["output_token_ids"][0] != 2**32:
                row["output_token_ids"] = None  # never a replay the model refuses as outside it
            lines[n] = json.dumps(row)
        else:  # a number written another way
            field, written = rng.choice((("input_length", "16.0"), ("input_length", "1E1"),
                                         ("output_length", "18446744073709551616"), ("timestamp", "1" + "0" * 309),
                                         ("timestamp", "1e-400"), ("hash_ids", "[18446744073709551615]"),
                                         ("hash_ids", "[18446744073709551616]"), ("delay", "-0")))
            row[field] = "@"
            lines[n] = json.dumps(row).replace('"@"', written)
        done.append(f"line {n + 1} {kind}")
    case["spoiled"] = done
    return case, lines, done


def _write_bytes(path: Path, text: str) -> None:
    """``text`` as UTF-8, surrogate escapes back to the raw bytes they stand for."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(text.encode("utf-8", "surrogateescape"))
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory to write the case directories into")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--record", action="store_true", help="also record the compiled reference's outcome")
    ap.add_argument("--timeout", type=float, default=20.0)
    kinds = ap.add_mutually_exclusive_group()
    kinds.add_argument("--odd", action="store_true", help="edge values of the right type instead (odd-* cases)")
    kinds.add_argument("--text", action="store_true", help="spoil the trace's JSON text instead (txt-* cases)")
    ns = ap.parse_args(argv)
    from mocker_spec.formats import atomic_write_text
    from mocker_spec.messages import output_dir_problem
    from mocker_spec.reference import record_case

    problem = output_dir_problem(ns.out)
    if problem:
        print(f"refusal_fuzz: --out {ns.out!r}: {problem}", file=sys.stderr)
        return 2
    out = Path(ns.out)
    for index in range(ns.start, ns.start + ns.count):
        case, lines, done = _text(ns.seed, index) if ns.text else spoil(ns.seed, index, odd=ns.odd)
        d = out / f"{'txt' if ns.text else 'odd' if ns.odd else 'bad'}-{ns.seed}-{index:04d}"
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "case.json", json.dumps(case, indent=1, sort_keys=True))
        _write_bytes(d / "trace.jsonl", "".join(line + "\n" for line in lines))
        status = record_case(d, timeout_s=ns.timeout) if ns.record else "-"
        print(f"{d.name}: {'; '.join(done)} -> {status[:100]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
