"""Replay speed: the oracle against the compiled reference on one seeded 2,000-request trace.

    python benchmarks/replay_bench.py [--requests N] [--seed S] [--timeout SECONDS]

Writes the trace to a temporary directory, runs the compiled dynamo-mocker
(ai-dynamo-runtime 1.3.0.post1, in a subprocess with a timeout) and the oracle
on it with the same engine args, checks that the per-request reports agree,
and prints both wall times and their ratio.  Needs the reference wheel
(`pip install -e '.[reference]'`); without it only the oracle time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ENGINE_ARGS = {"engine_type": "vllm", "num_gpu_blocks": 2048, "block_size": 16}
TRACE_BLOCK_SIZE = 512

REFERENCE = r"""
import sys, time, json
import dynamo._core as c
trace, report, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
c.run_mocker_trace_replay([trace], extra_engine_args=c.MockEngineArgs(**args),
                          trace_block_size=%d, report_jsonl_path=report)
print(time.perf_counter() - t)
""" % TRACE_BLOCK_SIZE


def write_trace(path: str, n: int, seed: int) -> None:
    rng = random.Random(seed)
    t = 0
    with open(path, "w") as f:
        for _ in range(n):
            t += rng.randint(0, 40)
            isl = rng.randint(64, 1024)
            hash_ids = [rng.randint(0, 30) for _ in range((isl + TRACE_BLOCK_SIZE - 1) // TRACE_BLOCK_SIZE)]
            f.write(json.dumps({"timestamp": t, "input_length": isl, "output_length": rng.randint(8, 128),
                                "hash_ids": hash_ids}) + "\n")


def rows(path: str):
    return sorted(json.dumps({k: v for k, v in json.loads(line).items() if k != "uuid"}, sort_keys=True)
                  for line in open(path) if line.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.jsonl")
        write_trace(trace, a.requests, a.seed)
        ref_report = os.path.join(d, "reference.jsonl")
        ours_report = os.path.join(d, "oracle.jsonl")
        ref_s = None
        try:
            proc = subprocess.run([sys.executable, "-c", REFERENCE, trace, ref_report, json.dumps(ENGINE_ARGS)],
                                  capture_output=True, text=True, timeout=a.timeout)
            if proc.returncode == 0:
                ref_s = float(proc.stdout.strip().splitlines()[-1])
            else:
                print(f"reference unavailable: {proc.stderr.strip().splitlines()[-1:]}")
        except subprocess.TimeoutExpired:
            print(f"reference did not finish within {a.timeout:.0f} s")
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mocker_spec.cli", "replay", trace, "--extra-engine-args",
                        json.dumps(ENGINE_ARGS), "--report-jsonl", ours_report], check=True,
                       stdout=subprocess.DEVNULL, timeout=max(a.timeout, 3600))
        ours_s = time.perf_counter() - t
        print(f"requests: {a.requests}  engine: {json.dumps(ENGINE_ARGS)}")
        print(f"oracle wall time:    {ours_s:8.2f} s (process, incl. start-up)")
        if ref_s is not None:
            same = rows(ref_report) == rows(ours_report)
            print(f"reference wall time: {ref_s:8.2f} s (replay call)")
            print(f"ratio oracle/reference: {ours_s / ref_s:.1f}x   reports {'identical' if same else 'DIFFER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
