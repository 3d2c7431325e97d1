"""Replay speed: the oracle against the compiled reference on one seeded 2,000-request trace.

    python benchmarks/replay_bench.py [--requests N] [--seed S] [--repeat R] [--engine-args JSON]
                                      [--timeout SECONDS]

Writes the trace to a temporary directory, runs the compiled dynamo-mocker
(ai-dynamo-runtime 1.3.0.post1, in a subprocess with a timeout) and the oracle
(``python -m mocker_spec.cli replay``, in a subprocess) on it with the same
engine args, checks that the per-request reports agree, and prints both wall
times and their ratio.  Each side runs ``--repeat`` times, alternating, and the
best time of each is kept (the machine may be shared).

The headline ratio is the oracle's whole process (interpreter start-up and
imports included) against the reference's replay call; the like-for-like ratio
compares the two replay calls (trace read, replay, report written; imports
excluded on both sides).  Needs the reference wheel
(``pip install -e '.[reference]'``); without it only the oracle times are printed.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mocker_spec.reference import run_script  # noqa: E402

ENGINE_ARGS = {"engine_type": "vllm", "num_gpu_blocks": 2048, "block_size": 16}
TRACE_BLOCK_SIZE = 512

# run through mocker_spec.reference.run_script: the job arrives as JSON on stdin and the time is
# written to a file, because the child's output only reaches us through a bounded tail
REFERENCE = r"""
import sys, time, json
import dynamo._core as c
job = json.loads(sys.stdin.read())
t = time.perf_counter()
c.run_mocker_trace_replay([job["trace"]], extra_engine_args=c.MockEngineArgs(**job["engine_args"]),
                          trace_block_size=%d, report_jsonl_path=job["report"])
with open(job["time_path"], "w") as fh:
    fh.write(repr(time.perf_counter() - t))
""" % TRACE_BLOCK_SIZE

# the oracle's CLI in this process: the time of its replay command after the imports
ORACLE = r"""
import contextlib, io, json, sys, time
from mocker_spec.cli import main
trace, report, args = sys.argv[1], sys.argv[2], sys.argv[3]
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(["replay", trace, "--extra-engine-args", args, "--trace-block-size", "%d",
               "--report-jsonl", report, "--no-progress"])
print(time.perf_counter() - t)
sys.exit(rc)
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


def run_reference(trace: str, report: str, engine_args: dict, timeout: float):
    """The reference's replay-call time in seconds, or None (and why) when it cannot run."""
    time_path = report + ".time"
    job = {"trace": trace, "report": report, "engine_args": engine_args, "time_path": time_path}
    timed_out, code, err = run_script(REFERENCE, job, timeout)
    if timed_out:
        return None, f"reference did not finish within {timeout:.0f} s"
    if code != 0:
        return None, f"reference unavailable: {err.strip().splitlines()[-1:]}"
    with open(time_path) as fh:
        return float(fh.read()), None


def run_oracle(trace: str, report: str, engine_args: dict, timeout: float):
    """``(process wall time, replay-call time)`` of the oracle's CLI, in seconds."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", ORACLE, trace, report, json.dumps(engine_args)],
                          capture_output=True, text=True, timeout=max(timeout, 3600))
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"oracle failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return wall, float(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side; the best time counts (default 3)")
    ap.add_argument("--engine-args", default=json.dumps(ENGINE_ARGS), help="engine args JSON (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    engine_args = json.loads(a.engine_args)
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.jsonl")
        write_trace(trace, a.requests, a.seed)
        ref_report = os.path.join(d, "reference.jsonl")
        ours_report = os.path.join(d, "oracle.jsonl")
        ref_times, ours_walls, ours_calls = [], [], []
        ref_error = None
        for _ in range(max(a.repeat, 1)):
            if ref_error is None:
                ref_s, ref_error = run_reference(trace, ref_report, engine_args, a.timeout)
                if ref_s is not None:
                    ref_times.append(ref_s)
            wall, call = run_oracle(trace, ours_report, engine_args, a.timeout)
            ours_walls.append(wall)
            ours_calls.append(call)
        ours_s, ours_call = min(ours_walls), min(ours_calls)
        print(f"requests: {a.requests}  engine: {json.dumps(engine_args)}  "
              f"runs: {len(ours_walls)} each (best kept)  cores: {os.cpu_count()}")
        print(f"oracle wall time:      {ours_s:8.2f} s (process, incl. start-up)")
        print(f"oracle replay call:    {ours_call:8.2f} s (CLI replay command, after imports)")
        if ref_error is not None:
            print(ref_error)
        if ref_times:
            ref_s = min(ref_times)
            same = rows(ref_report) == rows(ours_report)
            print(f"reference wall time:   {ref_s:8.2f} s (replay call)")
            print(f"ratio oracle/reference: {ours_s / ref_s:.1f}x   reports {'identical' if same else 'DIFFER'}")
            print(f"like-for-like ratio (replay call / replay call): {ours_call / ref_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
