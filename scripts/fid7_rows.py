#!/usr/bin/env python3
"""Print the FID-7 table row of each recorded divergent case (spec/fidelity.md, *Cases of FID-7*).

For a case directory of the corpus layout (``case.json``, ``trace.jsonl`` and the recorded
reference outputs), the script runs the model, compares it with the recording and prints one
Markdown row: the case, its family (the generator command, from the case's name), the pool where
the difference starts, the request that carries FID-7's
signature (``mocker_spec.reference.fid7_evidence``; the sum over a group of rows the comparison
cannot tell apart), its reuse in the model and in the reference
and the difference in blocks, the first divergence, and how many report rows differ. The last
column of the spec's table (where the all-or-nothing variant was checked) is the triager's, so the
script leaves a ``?`` there.

Usage: python scripts/fid7_rows.py CASE_DIR [CASE_DIR...]

Exit status: 0 when every case carries the signature, 1 when some case does not (it is named on
standard error, with its first divergence if any; on a vLLM or TRT-LLM worker it may still be FID-7,
hidden when the re-admission's reuse is not the request's largest: run it on the all-or-nothing
variant, and write its row by hand if that is identical, as spec/fidelity.md *Detection* says),
2 when a directory cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mocker_spec.reference import REL_TOL_RECORD, CaseError, Outcome, _close, _row_key, check_loaded_case, fid7_evidence, load_case


def _num(x: float) -> str:
    """A time or ratio as the spec writes it: two decimals at most, no trailing zeros."""
    s = f"{x:,.2f}".rstrip("0").rstrip(".")
    return s if s != "-0" else "0"


def _pool(args: Mapping[str, Any], workers: Any) -> str:
    n = workers if isinstance(workers, int) else 1
    parts = [f"{n} worker{'s' if n != 1 else ''}, {args.get('num_gpu_blocks')}×{args.get('block_size')} blocks"]
    if args.get("max_num_batched_tokens") is not None:
        parts.append(f"budget {args['max_num_batched_tokens']}")
    if args.get("max_num_seqs") is not None:
        parts.append(f"≤{args['max_num_seqs']} seqs")
    if args.get("speedup_ratio") not in (None, 1.0):
        parts.append(f"speed-up {_num(args['speedup_ratio'])}")
    if args.get("decode_speedup_ratio") not in (None, 1.0):
        parts.append(f"decode speed-up {_num(args['decode_speedup_ratio'])}")
    return ", ".join(parts)


def configuration(job: Mapping[str, Any], decode_side: bool) -> str:
    """Mode and the pool where the difference starts (the decode pool for a decode-side reuse)."""
    if job["mode"] == "agg":
        text = "agg; " + _pool(job["engine_args"], job.get("num_workers"))
    elif decode_side:
        text = "disagg, decode: " + _pool(job["decode_engine_args"], job.get("num_decode_workers"))
    else:
        text = "disagg, prefill: " + _pool(job["prefill_engine_args"], job.get("num_prefill_workers"))
    if job.get("arrival_speedup_ratio") not in (None, 1.0):
        text += f"; arrivals ×{_num(job['arrival_speedup_ratio'])}"
    if job.get("replay_concurrency") is not None:
        text += f"; {job['replay_concurrency']} in flight"
    return text


def _who(row: Mapping[str, Any]) -> str:
    return f"{row.get('input_length')}-token request at {_num(row.get('arrival_time_ms'))} ms"


#: the generators' name letters (``mocker_spec.casegen.write_cases``) and their flags
GEN_FLAGS = (("p", "--tight"), ("t", "--tiny"), ("l", "--large"), ("c", "--concurrency"),
             ("s", "--sessions"), ("x", "--extra-args"))
FUZZ_FLAGS = {"bad": "", "odd": "--odd ", "txt": "--text "}


def family(name: str) -> str:
    """The command that generates the case's family, from its name (``genxsl-223-0009``)."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return "?"
    kind, seed, _index = parts
    if kind in FUZZ_FLAGS:
        return f"`refusal_fuzz.py {FUZZ_FLAGS[kind]}--seed {seed}`"
    if not kind.startswith("gen") or any(ch not in dict(GEN_FLAGS) for ch in kind[3:]):
        return "?"
    flags = [flag for ch, flag in GEN_FLAGS if ch in kind[3:]]
    return "`" + " ".join(flags + [f"--seed {seed}"]) + "`"


def _pairs(ours: Outcome, ref: Outcome) -> List[Tuple[Dict[str, Any], Dict[str, Any]]]:
    return list(zip(sorted(ours.records or [], key=_row_key), sorted(ref.records or [], key=_row_key)))


def fid7_row(case_dir: Path) -> Optional[str]:
    """The case's table row, or None when it does not carry FID-7's signature."""
    job, ref = load_case(case_dir)
    ours, ref, div = check_loaded_case(job, ref)
    found = fid7_evidence(job, ours, ref)
    if div is None or found is None:
        return None
    pairs = _pairs(ours, ref)
    decode_side = found.field == "decode_reused_input_tokens"
    m, r, b = found.model, found.reference, found.rows[0]
    args = job["engine_args"] if job["mode"] == "agg" else job["decode_engine_args" if decode_side else "prefill_engine_args"]
    blocks = (m - r) // int(args["block_size"])
    reuse = f"{m} / {r}" + (" on decode" if decode_side else "") + f" (+{blocks} block{'s' if blocks != 1 else ''})"
    who = _who(b) if len(found.rows) == 1 else f"{len(found.rows)} {b.get('input_length')}-token requests from {_num(b.get('arrival_time_ms'))} ms"
    differing = sum(1 for x, y in pairs if any(k != "uuid" and not _close(x.get(k), v, REL_TOL_RECORD)
                                             for k, v in y.items()))
    # the first divergence, in the comparison's order
    req = div.request or {}
    same = all(req.get(f) == b.get(f) for f in ("arrival_time_ms", "input_length", "output_length"))
    if div.where == "record" and div.field == found.field and same:
        first = "the reuse itself"
    elif div.where == "record" and isinstance(div.ours, (int, float)) and isinstance(div.reference, (int, float)):
        delta = div.reference - div.ours
        whose = "that request" if same else f"the {_who(req)}"
        first = f"`{div.field}` of {whose}, {abs(delta):.2f} ms {'later' if delta > 0 else 'earlier'} in the reference"
    else:
        first = div.describe()
    return (f"| {case_dir.name} | {family(case_dir.name)} | {configuration(job, decode_side)} | {who} | "
            f"{reuse} | {first} | {differing} of {len(pairs)} | ? |")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", type=Path, metavar="CASE_DIR")
    args = ap.parse_args(argv)
    missing = 0
    for d in args.cases:
        try:
            row = fid7_row(d)
        except (CaseError, OSError) as exc:
            print(f"fid7_rows: {exc}", file=sys.stderr)
            return 2
        if row is None:
            missing += 1
            job, ref = load_case(d)
            div = check_loaded_case(job, ref)[2]
            print(f"fid7_rows: {d.name}: no FID-7 signature ({div.describe() if div else 'identical'})", file=sys.stderr)
        else:
            print(row)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
