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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mocker_spec.reference import record_case  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case_dir")
    ap.add_argument("--timeout", type=float, default=120.0)
    ns = ap.parse_args(argv)
    status = record_case(ns.case_dir, timeout_s=ns.timeout)
    print(f"{Path(ns.case_dir).name}: {status}")
    return 2 if status.startswith("error: compiled reference not installed") else 0

if __name__ == "__main__":
    sys.exit(main())
