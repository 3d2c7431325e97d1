"""A seeded generator of replay cases in the refcases layout (case.json + trace.jsonl).

Each case is a pure function of ``(seed, index)``: aggregated vLLM / TRT-LLM / SGLang with 1-3
workers, or disaggregated vLLM / SGLang with 1-2 workers per pool; tight KV pools, chunked
prefill on and off (SGLang: small ``sglang.chunked_prefill_size``), the SGLang LPM policy and
prefill budgets, prefix sharing through common leading hash ids, speed-ups, FIFO and LIFO
preemption, arrival speed-ups.  ``mocker-spec gen-cases`` writes them and, with ``--record``,
records the compiled reference's outputs next to them (expected.*), so that
``mocker-spec diff --corpus DIR`` can compare the oracle with the reference.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from explorer.files import publish
from model.engine_args import DEFAULT_BLOCK_SIZE, EngineType

KINDS = (
    ("agg", "vllm"),
    ("agg", "trtllm"),
    ("agg", "sglang"),
    ("disagg", "vllm"),
    ("disagg", "sglang"),
)


def _engine_args(rng: random.Random, engine: str, worker_type: str, max_isl: int,
                 block_size: Optional[int] = None) -> Dict[str, Any]:
    bs = block_size if block_size is not None else rng.choice([1, 4, 8, 16, 32] if engine == "sglang" else [4, 8, 16, 32])
    need = math.ceil(max_isl / bs)
    tight = rng.random() < 0.6
    blocks = rng.randint(need + 1, need * 3) if tight else rng.randint(need * 4, need * 30)
    args: Dict[str, Any] = {"engine_type": engine, "block_size": bs, "num_gpu_blocks": blocks,
                            "speedup_ratio": rng.choice([0.5, 1.0, 2.5]), "worker_type": worker_type}
    if rng.random() < 0.5:
        args["max_num_seqs"] = rng.choice([1, 2, 4, 8, 32])
    if rng.random() < 0.5:
        args["max_num_batched_tokens"] = rng.choice([64, 128, 512, 2048, 8192])
    if rng.random() < 0.3:
        args["enable_prefix_caching"] = False
    if rng.random() < 0.3 and engine != "sglang":
        args["enable_chunked_prefill"] = False
    if rng.random() < 0.3:
        args["decode_speedup_ratio"] = rng.choice([0.5, 2.0])
    if rng.random() < 0.3 and engine == "vllm":
        args["preemption_mode"] = "fifo"
    if engine == "sglang" and rng.random() < 0.6:
        # SGLang reads its own sub-arguments (spec/engine-args.md ARGS-12): chunking only happens
        # below the 8192-token default chunk, and the LPM policy only when asked for.  Every
        # chunk size here is a multiple of every SGLang block size drawn above (ARGS-9).
        sg: Dict[str, Any] = {}
        if rng.random() < 0.6:
            sg["chunked_prefill_size"] = rng.choice([64, 128, 256])
        if rng.random() < 0.5:
            sg["schedule_policy"] = rng.choice(["lpm", "fifo"])
        if rng.random() < 0.3:
            sg["max_prefill_tokens"] = rng.choice([256, 1024])
        if rng.random() < 0.3:
            sg["clip_max_new_tokens"] = rng.choice([8, 32])
        if rng.random() < 0.3:
            sg["schedule_conservativeness"] = rng.choice([0.3, 2.0])
        if sg:
            args["sglang"] = sg
    return args


def _trace(rng: random.Random, trace_block_size: int) -> List[Dict[str, Any]]:
    n = rng.randint(4, 36)
    groups = [[rng.randint(1, 999_999) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 3))]
    burst = rng.random() < 0.4
    t = 0.0
    next_unique = 10_000_001
    rows = []
    for _ in range(n):
        if not burst:
            t = round(t + rng.expovariate(1 / 30.0), 3)
        isl = rng.randint(16, 640)
        blocks = math.ceil(isl / trace_block_size)
        prefix = list(rng.choice(groups)) if rng.random() < 0.5 else []
        prefix = prefix[:blocks]
        unique = list(range(next_unique, next_unique + blocks - len(prefix)))
        next_unique += len(unique)
        rows.append({"timestamp": t, "input_length": isl, "output_length": rng.randint(1, 48),
                     "hash_ids": prefix + unique})
    return rows


def generate_case(seed: int, index: int, concurrency: bool = False, extra_args: bool = False,
                  sessions: bool = False, large: bool = False, tiny: bool = False,
                  tight: bool = False) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """Case ``index`` of the family ``seed``: ``(case.json content, trace rows)``.

    The variants draw the same case, then change it from streams of their own, so the plain
    families stay as they are:

    - ``concurrency`` sets ``replay_concurrency`` (1-8) on about two cases in three and shuffles the
      rows of about one in three, so timestamps go backwards: the file order that concurrency mode
      keeps (spec/replay.md WL-20) and the stable sort that trace mode applies (WL-15) then differ;
    - ``extra_args`` adds, per engine-args object, the arguments the plain cases leave at their
      defaults: ``startup_time``, ``aic_tp_size`` / ``aic_attention_dp_size`` (GPU counts of the
      worker-hours, ARGS-17), ``kv_bytes_per_token`` / ``kv_transfer_bandwidth`` /
      ``kv_transfer_timing_mode`` (transfer timing, TIME-12..TIME-14; a bandwidth of 0 is rare and
      fails the disaggregated replay) and ``router_queue_policy``;
    - ``sessions`` groups the rows into multi-turn sessions (``session_id``; a later turn keeps its
      timestamp, so its think time is inferred, or gets a ``delay`` of 0-40 ms instead), run by the
      session workload driver (spec/replay.md DRV-17);
    - ``large`` (applied first) appends the rows of 2-7 other cases of the family, later in time and
      with their own unique hash ids (shared leading ids stay shared), grows each pool to hold the
      longest prompt, and draws 1-8 aggregated workers or 1-4 per disaggregated pool: traces of
      about 50-250 requests on more workers than the plain cases have;
    - ``tiny`` draws a different case from a stream of its own (``large`` cannot be combined
      with it): pools of 1-8 blocks of 4-16 tokens, 1-4 requests of 1-40 prompt tokens and 0-12
      output tokens (0 included) drawn from six hash ids, budgets down to one block, one or two
      workers per pool.  These are the edge cases (dead ends, both livelock shapes of LIVE-1 and
      LIVE-7, requests that can never fit) that the plain cases reach only rarely;
    - ``tight`` (applied after ``large``; not with ``tiny``, whose pools are tight already) cuts every
      pool to what the case's largest request needs there, its prompt and output on an aggregated or
      decode worker, its prompt on a prefill worker, plus 0, 1, 2 or 5 blocks or a quarter or half
      more, and limits about half of the pools to 1-8 sequences and a third of those that chunk
      prefills to a 32-256-token budget: the plain traces on pools that preempt, retract and
      dead-end often."""
    if tiny and (large or tight):
        raise ValueError("the tiny variant cannot be combined with large or tight")
    case, rows = _tiny_case(seed, index) if tiny else _generate_case(seed, index)
    if large:
        case, rows = _enlarge(seed, index, case, rows)
    if tight:
        _tighten(seed, index, case, rows)
    if concurrency:
        rng = random.Random(f"mocker-spec-casegen-concurrency:{seed}:{index}")
        if rng.random() < 0.67:
            case["replay_concurrency"] = rng.randint(1, 8)
        if rng.random() < 0.33:
            rng.shuffle(rows)
    if sessions:
        rng = random.Random(f"mocker-spec-casegen-sessions:{seed}:{index}")
        count = rng.randint(1, max(1, len(rows) // 2))
        by_delay = rng.random() < 0.5
        last: Dict[str, float] = {}
        for row in rows:
            sid = f"s{rng.randrange(count)}"
            row["session_id"] = sid
            # a later turn stamped before its session's previous one (rows shuffled by the
            # concurrency variant) would be refused for its negative think time: give it a delay
            backwards = sid in last and row["timestamp"] < last[sid]
            if sid in last and (backwards or (by_delay and rng.random() < 0.7)):
                del row["timestamp"]
                row["delay"] = rng.choice([0.0, 3.5, 40.0])
            else:
                last[sid] = row["timestamp"]
    if extra_args:
        rng = random.Random(f"mocker-spec-casegen-extra-args:{seed}:{index}")
        for key in ("engine_args", "prefill_engine_args", "decode_engine_args"):
            if key in case:
                case[key].update(_extra_args(rng))
    return case, rows


def _enlarge(seed: int, index: int, case: Dict[str, Any], rows: List[Dict[str, Any]]):
    rng = random.Random(f"mocker-spec-casegen-large:{seed}:{index}")
    t0 = max(r["timestamp"] for r in rows)
    for j in range(1, rng.randint(3, 8)):
        _, more = _generate_case(seed, 10_000 + 100 * index + j)
        for r in more:
            r = dict(r)
            r["timestamp"] = round(r["timestamp"] + t0 * j * rng.uniform(0.3, 1.0), 3)
            r["hash_ids"] = [h + 7_000_000 * j if h >= 10_000_000 else h for h in r["hash_ids"]]
            rows.append(r)
    rows.sort(key=lambda r: r["timestamp"])
    longest = max(r["input_length"] for r in rows)
    for key in ("engine_args", "prefill_engine_args", "decode_engine_args"):
        if key in case:
            a = case[key]
            a["num_gpu_blocks"] = max(a["num_gpu_blocks"], -(-longest // a["block_size"]) + 1)
    if case["mode"] == "agg":
        case["num_workers"] = rng.randint(1, 8)
    else:
        case["num_prefill_workers"] = rng.randint(1, 4)
        case["num_decode_workers"] = rng.randint(1, 4)
    return case, rows


def _extra_args(rng: random.Random) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if rng.random() < 0.5:
        out["startup_time"] = rng.choice([0.0, 0.5, 2.0])
    if rng.random() < 0.5:
        out["aic_tp_size"] = rng.choice([1, 2, 4])
    if rng.random() < 0.5:
        out["aic_attention_dp_size"] = rng.choice([1, 2])
    if rng.random() < 0.6:
        out["kv_bytes_per_token"] = rng.choice([1, 1000, 131072])
    if rng.random() < 0.6:
        out["kv_transfer_bandwidth"] = 0.0 if rng.random() < 0.05 else rng.choice([0.5, 5.0, 100.0])
    if rng.random() < 0.5:
        out["kv_transfer_timing_mode"] = rng.choice(["full_prompt", "destination_missing"])
    if rng.random() < 0.4:
        out["router_queue_policy"] = rng.choice(["fcfs", "lcfs", "wspt"])
    return out


def _generate_case(seed: int, index: int) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    rng = random.Random(f"mocker-spec-casegen:{seed}:{index}")
    mode, engine = rng.choice(KINDS)
    tbs = rng.choice([8, 16, 32, 64])
    rows = _trace(rng, tbs)
    max_isl = max(r["input_length"] for r in rows)
    case: Dict[str, Any] = {"mode": mode, "router_mode": "round_robin", "trace_block_size": tbs}
    if mode == "agg":
        case["engine_args"] = _engine_args(rng, engine, "aggregated", max_isl)
        case["num_workers"] = rng.randint(1, 3)
    else:
        case["prefill_engine_args"] = _engine_args(rng, engine, "prefill", max_isl)
        # both pools must use one block size (spec/replay.md DRV-1), so the decode pool's
        # tightness is drawn against the prefill pool's block size
        bs = case["prefill_engine_args"]["block_size"]
        case["decode_engine_args"] = _engine_args(rng, engine, "decode", max_isl, block_size=bs)
        case["num_prefill_workers"] = rng.randint(1, 2)
        case["num_decode_workers"] = rng.randint(1, 2)
    if rng.random() < 0.2:
        case["arrival_speedup_ratio"] = rng.choice([0.5, 3.0])
    return case, rows


def _tiny_case(seed: int, index: int) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    rng = random.Random(f"mocker-spec-casegen-tiny:{seed}:{index}")
    mode, engine = rng.choice(KINDS)
    bs = rng.choice([4, 8, 16])

    def engine_args(worker_type: str) -> Dict[str, Any]:
        args: Dict[str, Any] = {"engine_type": engine, "block_size": bs, "num_gpu_blocks": rng.randint(1, 8),
                                "worker_type": worker_type}
        if rng.random() < 0.7:
            args["max_num_seqs"] = rng.choice([1, 2, 3])
        if rng.random() < 0.7:
            args["max_num_batched_tokens"] = rng.choice([bs, 2 * bs, 64])
        if rng.random() < 0.5:
            args["enable_prefix_caching"] = False
        if rng.random() < 0.3 and engine != "sglang":
            args["enable_chunked_prefill"] = False
        if engine == "sglang" and rng.random() < 0.4:
            args["sglang"] = {"chunked_prefill_size": rng.choice([16, 32])}  # multiples of bs (ARGS-9)
        return args

    tbs = rng.choice([4, 8, 16])
    case: Dict[str, Any] = {"mode": mode, "router_mode": "round_robin", "trace_block_size": tbs}
    if mode == "agg":
        case["engine_args"] = engine_args("aggregated")
        case["num_workers"] = rng.choice([1, 1, 2])
    else:
        case["prefill_engine_args"] = engine_args("prefill")
        case["decode_engine_args"] = engine_args("decode")  # one block size for both (DRV-1)
        case["num_prefill_workers"] = rng.choice([1, 2])
        case["num_decode_workers"] = rng.choice([1, 2])
    rows = []
    t = 0.0
    for _ in range(rng.randint(1, 4)):
        isl = rng.randint(1, 40)
        rows.append({"timestamp": t, "input_length": isl, "output_length": rng.choice([0, 1, 1, 2, 5, 12]),
                     "hash_ids": [rng.randint(0, 5) for _ in range(math.ceil(isl / tbs))]})
        t += rng.choice([0.0, 1.0, 3.0, 20.0])
    return case, rows


def _tighten(seed: int, index: int, case: Dict[str, Any], rows: List[Dict[str, Any]]) -> None:
    """The ``tight`` variant (see :func:`generate_case`), in place, from a stream of its own."""
    rng = random.Random(f"mocker-spec-casegen-tight:{seed}:{index}")
    sides = (("engine_args", True),) if case["mode"] == "agg" else (("prefill_engine_args", False),
                                                                     ("decode_engine_args", True))
    for key, with_output in sides:
        args = case[key]
        bs = args.get("block_size") or DEFAULT_BLOCK_SIZE[EngineType(args.get("engine_type", "vllm"))]
        need = max(math.ceil((r["input_length"] + (r["output_length"] if with_output else 0)) / bs) for r in rows)
        args["num_gpu_blocks"] = max(1, need + rng.choice([0, 1, 2, 5, need // 4, need // 2]))
        if rng.random() < 0.5:
            args["max_num_seqs"] = rng.choice([1, 2, 3, 8])
        # a budget below the prompt can only be met by chunking: without it the cut would make
        # most cases dead-end on configuration (VLLM-6), which the tiny family covers already
        if rng.random() < 0.33 and args.get("enable_chunked_prefill", True) is not False:
            args["max_num_batched_tokens"] = rng.choice([32, 64, 128, 256])


def write_cases(out: Path, seed: int, count: int, start: int = 0, concurrency: bool = False,
                extra_args: bool = False, sessions: bool = False, large: bool = False,
                tiny: bool = False, tight: bool = False) -> List[Path]:
    """Write cases ``start .. start+count-1`` of family ``seed`` under ``out`` (one directory each:
    ``gen-*``; a variant adds ``c`` (concurrency), ``x`` (extra args), ``s`` (sessions), ``l``
    (large), ``t`` (tiny), ``p`` (tight pools), e.g. ``gencs-*``)."""
    dirs = []
    prefix = ("gen" + ("c" if concurrency else "") + ("x" if extra_args else "") + ("s" if sessions else "")
              + ("l" if large else "") + ("t" if tiny else "") + ("p" if tight else ""))
    for i in range(start, start + count):
        case, rows = generate_case(seed, i, concurrency, extra_args, sessions, large, tiny, tight)
        d = out / f"{prefix}-{seed}-{i:04d}"
        # each case appears whole or not at all; written again, it keeps a recorded outcome
        publish(d, [("case.json", json.dumps(case, indent=1, sort_keys=True) + "\n"),
                    ("trace.jsonl", "".join(json.dumps(r) + "\n" for r in rows))])
        dirs.append(d)
    return dirs
