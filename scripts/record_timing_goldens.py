#!/usr/bin/env python3
"""Record reference timestamps for tests/test_timing.py (tests/goldens/timing_goldens.json).

Each scenario is a trace of isolated single requests (arrivals 100 s apart,
disjoint hash ids), replayed by the compiled reference
``dynamo._core.run_mocker_trace_replay`` (ai-dynamo-runtime 1.3.0.post1).  Every
run happens in a child process under a timeout, because the reference can
hang.  The recorded per-request report fields are what the timing rules must
reproduce exactly (see tests/test_timing.py::test_reference_goldens).

Usage: python scripts/record_timing_goldens.py [--out PATH] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mocker_spec.reference import run_script  # noqa: E402

GAP_MS = 100_000.0
TRACE_BLOCK_SIZE = 16

#: (name, mode, settings, [(input_length, output_length), ...])
SCENARIOS = [
    ("vllm_defaults", "agg", {"engine_args": {}}, [(100, 3), (1, 2), (640, 4), (1000, 5), (4097, 2)]),
    (
        "vllm_small_pool_speedups",
        "agg",
        {"engine_args": {"block_size": 16, "num_gpu_blocks": 40, "speedup_ratio": 2.5, "decode_speedup_ratio": 0.5}},
        [(300, 6), (37, 3), (600, 4)],
    ),
    (
        "vllm_speedup_zero",
        "agg",
        {"engine_args": {"block_size": 8, "num_gpu_blocks": 100, "speedup_ratio": 0.0}},
        [(123, 4), (700, 3)],
    ),
    (
        "vllm_decode_speedup_zero",
        "agg",
        {"engine_args": {"block_size": 8, "num_gpu_blocks": 100, "speedup_ratio": 2.0, "decode_speedup_ratio": 0.0}},
        [(123, 4), (50, 2)],
    ),
    ("trtllm_half_speed", "agg", {"engine_args": {"engine_type": "trtllm", "speedup_ratio": 0.5}}, [(333, 4), (64, 3)]),
    (
        "sglang_defaults_fast",
        "agg",
        {"engine_args": {"engine_type": "sglang", "num_gpu_blocks": 2000, "speedup_ratio": 3.0}},
        [(100, 3), (1500, 4), (7, 2)],
    ),
    (
        "sglang_paged",
        "agg",
        {
            "engine_args": {
                "engine_type": "sglang",
                "num_gpu_blocks": 64,
                "decode_speedup_ratio": 2.0,
                "sglang": {"page_size": 16},
            }
        },
        [(200, 5), (33, 3)],
    ),
    (
        "vllm_disagg_full_prompt",
        "disagg",
        {
            "prefill_engine_args": {
                "block_size": 16,
                "num_gpu_blocks": 256,
                "worker_type": "prefill",
                "kv_transfer_bandwidth": 1.0,
                "kv_bytes_per_token": 62500,
                "speedup_ratio": 1.5,
            },
            "decode_engine_args": {"block_size": 16, "num_gpu_blocks": 256, "worker_type": "decode"},
        },
        [(160, 3), (45, 2)],
    ),
    (
        "vllm_disagg_destination_missing",
        "disagg",
        {
            "prefill_engine_args": {
                "block_size": 16,
                "num_gpu_blocks": 256,
                "worker_type": "prefill",
                "kv_transfer_bandwidth": 3.0,
                "kv_bytes_per_token": 100000,
                "kv_transfer_timing_mode": "destination_missing",
            },
            "decode_engine_args": {
                "block_size": 16,
                "num_gpu_blocks": 256,
                "worker_type": "decode",
                "speedup_ratio": 2.0,
            },
        },
        [(160, 3), (64, 2)],
    ),
    (
        "vllm_disagg_no_bandwidth",
        "disagg",
        {
            "prefill_engine_args": {"block_size": 16, "num_gpu_blocks": 256, "worker_type": "prefill"},
            "decode_engine_args": {
                "block_size": 16,
                "num_gpu_blocks": 256,
                "worker_type": "decode",
                "kv_transfer_bandwidth": 1.0,
                "kv_bytes_per_token": 62500,
            },
        },
        [(160, 2)],
    ),
    (
        "sglang_disagg_full_prompt",
        "disagg",
        {
            "prefill_engine_args": {
                "engine_type": "sglang",
                "block_size": 4,
                "num_gpu_blocks": 500,
                "worker_type": "prefill",
                "kv_transfer_bandwidth": 2.0,
                "kv_bytes_per_token": 70000,
            },
            "decode_engine_args": {
                "engine_type": "sglang",
                "block_size": 4,
                "num_gpu_blocks": 300,
                "worker_type": "decode",
                "speedup_ratio": 0.5,
            },
        },
        [(120, 3), (9, 2)],
    ),
]

KEEP = (
    "arrival_time_ms",
    "first_admit_ms",
    "first_token_ms",
    "last_token_ms",
    "ttst_ms",
    "input_length",
    "output_length",
    "prefill_admit_ms",
    "source_held_ms",
    "destination_reserved_ms",
    "destination_activated_ms",
    "decode_admit_ms",
    "terminal_status",
)

_CHILD = r"""
import json, sys
import dynamo._core as c
spec = json.loads(sys.stdin.read())
mk = lambda a: c.MockEngineArgs.from_json(json.dumps(a))
kw = dict(trace_block_size=spec["trace_block_size"], report_jsonl_path=spec["report"], router_mode="round_robin")
if spec["mode"] == "agg":
    kw.update(extra_engine_args=mk(spec["settings"]["engine_args"]), num_workers=1)
else:
    kw.update(prefill_engine_args=mk(spec["settings"]["prefill_engine_args"]),
              decode_engine_args=mk(spec["settings"]["decode_engine_args"]),
              num_prefill_workers=1, num_decode_workers=1)
c.run_mocker_trace_replay([spec["trace"]], **kw)
"""


def _trace_rows(requests):
    rows, next_hash = [], 1
    for i, (isl, osl) in enumerate(requests):
        n_hash = -(-isl // TRACE_BLOCK_SIZE)
        hash_ids = list(range(next_hash, next_hash + n_hash))
        next_hash += n_hash
        rows.append({"timestamp": i * GAP_MS, "input_length": isl, "output_length": osl, "hash_ids": hash_ids})
    return rows


def run_scenario(name, mode, settings, requests, timeout):
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.jsonl")
        report = os.path.join(tmp, "report.jsonl")
        with open(trace, "w") as fh:
            for row in _trace_rows(requests):
                fh.write(json.dumps(row) + "\n")
        spec = {
            "mode": mode,
            "settings": settings,
            "trace": trace,
            "report": report,
            "trace_block_size": TRACE_BLOCK_SIZE,
        }
        # bounded log tail and process-group kill at the timeout (the reference can hang while logging)
        timed_out, code, err = run_script(_CHILD, spec, timeout)
        if timed_out:
            raise RuntimeError(f"{name}: the reference did not finish within {timeout:g} s")
        if code != 0:
            raise RuntimeError(f"{name}: reference failed: {err[-2000:]}")
        with open(report) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    rows.sort(key=lambda r: r["arrival_time_ms"])
    return [{k: row[k] for k in KEEP} for row in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "goldens", "timing_goldens.json"))
    parser.add_argument("--timeout", type=float, default=120.0)
    ns = parser.parse_args()
    out = []
    for name, mode, settings, requests in SCENARIOS:
        rows = run_scenario(name, mode, settings, requests, ns.timeout)
        out.append(
            {
                "name": name,
                "mode": mode,
                "settings": settings,
                "trace_block_size": TRACE_BLOCK_SIZE,
                "gap_ms": GAP_MS,
                "requests": [list(r) for r in requests],
                "report": rows,
            }
        )
        print(f"{name}: {len(rows)} rows", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(ns.out)), exist_ok=True)
    with open(ns.out, "w") as fh:
        json.dump(
            {
                "produced_by": "scripts/record_timing_goldens.py against ai-dynamo-runtime 1.3.0.post1",
                "scenarios": out,
            },
            fh,
            indent=1,
        )
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
