"""Record what the compiled reference produces for a replay case (the refcases layout).

Usage: python scripts/record_refcase.py CASE_DIR [--timeout SECONDS]

CASE_DIR holds ``case.json`` (mode, engine args, worker counts, trace_block_size, router_mode,
optional arrival_speedup_ratio / replay_concurrency) and ``trace.jsonl``.  The script runs
``dynamo._core.run_mocker_trace_replay`` (ai-dynamo-runtime 1.3.0.post1) in a subprocess with a
timeout and writes ``expected.status`` (``ok``, ``timeout`` or ``error: <message>``),
``expected.report.jsonl`` and ``expected.summary.json`` (less ``wall_time_ms``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mocker_spec.formats import atomic_write_text, dumps_compact  # noqa: E402
from mocker_spec.reference import run_reference  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case_dir")
    ap.add_argument("--timeout", type=float, default=120.0)
    ns = ap.parse_args(argv)
    d = Path(ns.case_dir)
    job = json.loads((d / "case.json").read_text())
    job["trace_file"] = str(d / "trace.jsonl")
    out = run_reference(job, timeout_s=ns.timeout)
    if out.status == "ok":
        atomic_write_text(d / "expected.report.jsonl", "".join(dumps_compact(r) + "\n" for r in out.records or []))
        atomic_write_text(d / "expected.summary.json", json.dumps(out.summary, indent=1, sort_keys=True))
        status = "ok"
    elif out.status == "timeout":
        status = "timeout"
    else:
        status = f"error: {out.message}"
    atomic_write_text(d / "expected.status", status + "\n")
    print(f"{d.name}: {status}")
    return 0 if out.status != "error" or not out.message.startswith("compiled reference not installed") else 2


if __name__ == "__main__":
    sys.exit(main())
