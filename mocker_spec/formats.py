"""File formats of offline replay: trace JSONL in, report JSONL and summary JSON out.

Shell code (I/O); the rules live in the pure modules ``model.workload`` (WL-*)
and ``model.report`` (REP-*), see spec/replay.md.

Writes are atomic: the content goes to a temporary file in the target
directory, is flushed and fsynced, then renamed over the target, so a reader
never sees a half-written file and a failed write leaves the old file alone.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from model.errors import InvalidInput
from model.report import PerRequestRecord, REPORT_FIELDS, TerminalStatus
from model.workload import (
    DEFAULT_TRACE_BLOCK_SIZE,
    FlatWorkload,
    SessionWorkload,
    Trace,
    load_concurrency_trace_workload,
    load_trace_workload,
    parse_mooncake_line,
    trace_from_mooncake_rows,
)

__all__ = [
    "read_trace_lines",
    "read_trace",
    "load_trace_file",
    "InputFileError",
    "read_input_file",
    "load_concurrency_trace_file",
    "format_json_float",
    "dumps_compact",
    "record_line",
    "write_report_jsonl",
    "read_report_jsonl",
    "summary_text",
    "write_summary_json",
    "atomic_write_text",
]


# ---------------------------------------------------------------------------
# reading traces (WL-3)
# ---------------------------------------------------------------------------


def iter_trace_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    """WL-3: the lines of a trace file, read one at a time like Rust ``BufRead::lines``.

    Lines end at ``\\n``, which is dropped with a ``\\r`` just before it; a final newline does
    not start another line.  Invalid UTF-8 is an error naming the line, raised when that line is
    reached, so an earlier bad row is reported first.  The file is opened at the first line
    asked for (after the caller's own checks, WL-5).
    """
    name = os.fspath(path)  # as given, as Rust's Path::display shows it
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InvalidInput("trace_file", name, f"failed to open trace file {name}", rule="WL-3",
                           detail=exc.strerror or str(exc)) from None
    with f:
        for i, raw in enumerate(f, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                where = f"0x{raw[exc.start]:02x} at byte {exc.start + 1}"
                err = InvalidInput(f"trace line {i}: bytes", where, f"failed to read line {i} from {name}", rule="WL-3",
                                   detail="invalid UTF-8")
                err.line = i  # type: ignore[attr-defined]
                raise err from None
            yield text


def read_trace_lines(path: str | os.PathLike[str]) -> list[str]:
    """WL-3: every line of a trace file (:func:`iter_trace_lines`)."""
    return list(iter_trace_lines(path))


def _rows(path: str | os.PathLike[str]):
    """WL-3: the parsed rows of a trace file, one line at a time; refusals name the file as given."""
    name = os.fspath(path)
    for i, text in enumerate(iter_trace_lines(path), start=1):
        yield i, parse_mooncake_line(text, i, name)


def read_trace(path: str | os.PathLike[str], trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE) -> Trace:
    """WL-3..WL-8: parse a mooncake JSONL file into sessions (no timing changes)."""
    return trace_from_mooncake_rows(_rows(path), trace_block_size, os.fspath(path))


class InputFileError(ValueError):
    """An input file that cannot be read or decoded: its name and why, in one line."""


def read_input_file(path: str | os.PathLike[str], *, parse_json: bool = False, lines: bool = False,
                    label: str | None = None):
    """The text of ``path``, its JSON value, or its JSON lines; :class:`InputFileError` (named
    ``label``, default the path) when it cannot be read, is not UTF-8 or is not valid JSON."""
    name = label if label is not None else str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
        if lines:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return json.loads(text) if parse_json else text
    except OSError as exc:
        raise InputFileError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputFileError(f"{name}: not UTF-8") from None
    except ValueError as exc:
        raise InputFileError(f"{name}: invalid JSON: {exc}") from None


def load_trace_file(
    path: str | os.PathLike[str],
    trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE,
    arrival_speedup_ratio: float = 1.0,
    trace_format: str = "mooncake",
    *,
    validate_sessions: bool = True,
) -> FlatWorkload | SessionWorkload:
    """WL-14: the full offline trace-file pipeline (see ``model.workload.load_trace_workload``)."""
    return load_trace_workload(_rows(path), trace_block_size, arrival_speedup_ratio, trace_format, source=os.fspath(path),
                               validate_sessions=validate_sessions)


def load_concurrency_trace_file(
    path: str | os.PathLike[str], trace_block_size: int = DEFAULT_TRACE_BLOCK_SIZE, *, validate: bool = True,
    accumulate_deltas: bool = False,
) -> FlatWorkload | SessionWorkload:
    """WL-20: a trace file replayed with ``replay_concurrency`` (``model.workload.load_concurrency_trace_workload``)."""
    return load_concurrency_trace_workload(_rows(path), trace_block_size, validate=validate, source=os.fspath(path),
                                           accumulate_deltas=accumulate_deltas)


# ---------------------------------------------------------------------------
# serde_json-compatible serialization (REP-3)
# ---------------------------------------------------------------------------


def _shortest_digits(x: float) -> tuple[str, int]:
    """Shortest round-trip digits of ``abs(x) > 0`` and ``kk`` with ``x = 0.DIGITS * 10**kk``."""
    r = repr(abs(x))
    mant, _, exp = r.partition("e")
    e = int(exp) if exp else 0
    whole, _, frac = mant.partition(".")
    digits = (whole + frac).lstrip("0")
    # position of the decimal point relative to the start of whole+frac
    point = len(whole) + e
    lead = len(whole + frac) - len((whole + frac).lstrip("0"))
    digits = digits.rstrip("0")
    return digits, point - lead


def format_json_float(x: float) -> str:
    """REP-3: a float as serde_json writes it (ryu shortest form; ``null`` if not finite).

    Same digits as Python's ``repr``; the layout differs: plain notation for
    decimal exponents ``-5 < kk <= 16`` (so ``1e-05`` prints ``0.00001``), else
    ``1.5e-7`` / ``1e16`` style without ``+`` or zero padding.
    """
    if not math.isfinite(x):
        return "null"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign = "-" if x < 0 else ""
    digits, kk = _shortest_digits(x)
    n = len(digits)
    k = kk - n
    if 0 <= k and kk <= 16:
        body = digits + "0" * k + ".0"
    elif 0 < kk <= 16:
        body = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        body = "0." + "0" * (-kk) + digits
    elif n == 1:
        body = f"{digits}e{kk - 1}"
    else:
        body = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + body


def dumps_compact(value: Any) -> str:
    """REP-3: ``serde_json::to_string`` of a JSON value (no spaces, UTF-8 kept, ryu floats)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, TerminalStatus):
        return json.dumps(value.value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_json_float(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{dumps_compact(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps_compact(v) for v in value) + "]"
    raise TypeError(f"cannot serialize {type(value).__name__}")


def record_line(record: PerRequestRecord | Mapping[str, Any]) -> str:
    """REP-3: one JSONL row (without the newline), keys in :data:`REPORT_FIELDS` order: what
    ``dumps_compact`` writes for that mapping, with the key texts written once per process."""
    d = record.to_dict() if isinstance(record, PerRequestRecord) else record
    return "{" + ",".join([key + dumps_compact(d[name]) for name, key in _FIELD_KEYS]) + "}"


#: each report field with its serialised key and colon
_FIELD_KEYS = tuple((k, json.dumps(k, ensure_ascii=False) + ":") for k in REPORT_FIELDS)


# ---------------------------------------------------------------------------
# atomic writes
# ---------------------------------------------------------------------------


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` via temp file + fsync + rename; creates parent dirs."""
    from explorer.files import make_dirs, remove_dirs

    target = Path(path)
    parent = target.parent
    created = make_dirs(parent)  # taken away again if the write fails
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
    except BaseException:
        remove_dirs(created)
        raise
    return target


def write_report_jsonl(path: str | os.PathLike[str], records: Iterable[PerRequestRecord | Mapping[str, Any]]) -> Path:
    """REP-3..REP-5: one compact JSON object per line, newline-terminated, in the given order."""
    text = "".join(record_line(r) + "\n" for r in records)
    return atomic_write_text(path, text)


def read_report_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a report JSONL back into dicts (key order preserved)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def summary_text(summary: Mapping[str, Any]) -> str:
    """REP-18: the summary as the ``dynamo.replay`` CLI saves it (indent 2, sorted keys, final newline)."""
    return json.dumps(dict(summary), indent=2, sort_keys=True) + "\n"


def write_summary_json(path: str | os.PathLike[str], summary: Mapping[str, Any]) -> Path:
    """REP-18: write :func:`summary_text` atomically."""
    return atomic_write_text(path, summary_text(summary))
