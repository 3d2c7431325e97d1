"""What Rust's standard library and serde_json do with text, where Python's own functions differ.

Pure functions, used by the trace reader (spec/replay.md WL-2, WL-3) and the engine-argument
parser (spec/engine-args.md ARGS-10):

* :data:`RUST_WHITESPACE`: the characters ``str::trim`` removes (Unicode ``White_Space``);
  Python's ``str.strip()`` also removes U+001C..U+001F.
* :func:`rust_parse_f64`: ``f64::from_str``.
* :func:`rust_debug_str`: a string as ``{:?}`` writes it.
* :func:`serde_json_number`: how serde_json (default features, no ``float_roundtrip``) reads a
  JSON number literal: an unsigned or signed integer when one fits, else an f64 computed as an
  integer significand times or divided by a power of ten, which is not always correctly rounded.
* :func:`fields_once`: a ``json.loads`` object hook that refuses a key given twice, as serde's
  derived structs refuse a field given twice; the project's own JSON formats (scenario files,
  step traces) read their objects this way, where ``json`` would keep the last value silently.
* :func:`no_json_constant`: a ``json.loads`` ``parse_constant`` hook that refuses ``NaN``,
  ``Infinity`` and ``-Infinity``, which ``json`` reads and serde_json (like JSON itself) does not.
"""

from __future__ import annotations

import math
import re

__all__ = ["RUST_WHITESPACE", "fields_once", "no_json_constant", "rust_debug_str", "rust_parse_f64",
           "serde_json_number", "has_lone_surrogate"]

#: Rust's ``char::is_whitespace`` (Unicode White_Space), what ``str::trim`` removes
RUST_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                   "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")

#: ``f64::from_str``: a sign, then inf / infinity / nan (any case) or ASCII digits with an
#: optional point and exponent; no blanks, underscores, hex or other digits
_RUST_F64 = re.compile(r"[+-]?(?:inf|infinity|nan|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)", re.IGNORECASE)


_DEBUG_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}


def rust_debug_str(text: str) -> str:
    """A string as Rust's ``{:?}`` writes it: quoted, with backslash escapes, and ``\\u{..}`` for
    the other control characters (spec/engine-args.md ARGS-20)."""
    out = []
    for ch in text:
        if ch in _DEBUG_ESCAPES:
            out.append(_DEBUG_ESCAPES[ch])
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0:
            out.append(f"\\u{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def rust_parse_f64(text: str) -> float:
    """``text.parse::<f64>()``; ``ValueError`` where Rust returns an error. Rust's parse is
    correctly rounded, as Python's ``float`` is."""
    if _RUST_F64.fullmatch(text) is None:
        raise ValueError(text)
    return float(text)


_U64_MAX = (1 << 64) - 1
_I32_MAX = (1 << 31) - 1
_I32_MIN = -(1 << 31)
#: serde_json's POW10 table: the f64 literals 1e0 .. 1e308
_POW10 = tuple(float(f"1e{i}") for i in range(309))
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?")


class NumberOutOfRange(ValueError):
    """serde_json's "number out of range"."""

    def __init__(self) -> None:
        super().__init__("number out of range")


def _overflows(acc: int, digit: int, limit: int) -> bool:
    # serde_json's overflow! macro: would acc * 10 + digit exceed limit?
    return acc >= limit // 10 and (acc > limit // 10 or digit > limit % 10)


def _f64_from_parts(positive: bool, significand: int, exponent: int) -> float:
    f = float(significand)  # u64 as f64: round to nearest, ties to even, as Python's int -> float
    while True:
        magnitude = abs(exponent)
        if magnitude < len(_POW10):
            if exponent >= 0:
                f *= _POW10[magnitude]
                if math.isinf(f):
                    raise NumberOutOfRange()
            else:
                f /= _POW10[magnitude]
            break
        if f == 0.0:
            break
        if exponent >= 0:
            raise NumberOutOfRange()
        f /= 1e308
        exponent += 308
    return f if positive else -f


def _exponent(positive: bool, significand: int, start: int, sign: str, digits: str) -> float:
    exp = int(digits[0])
    for ch in digits[1:]:
        d = ord(ch) - 48
        if _overflows(exp, d, _I32_MAX):
            if significand != 0 and sign != "-":
                raise NumberOutOfRange()
            return 0.0 if positive else -0.0
        exp = exp * 10 + d
    final = start - exp if sign == "-" else start + exp
    return _f64_from_parts(positive, significand, max(_I32_MIN, min(_I32_MAX, final)))


def serde_json_number(text: str) -> int | float:
    """The value serde_json gives the JSON number literal ``text`` (as Python's ``json`` module
    passes it to ``parse_int`` / ``parse_float``): an ``int`` for an integer that fits a u64 or, when
    negative, an i64; otherwise a ``float``, ``-0`` included. ``NumberOutOfRange`` where serde_json
    refuses the number. Rules: spec/replay.md WL-2."""
    # fast paths, equal to the full reading below: a u64 / i64 of at most 18 digits, and a plain
    # decimal of at most 15 digits with at most 22 after the point (an exact significand below
    # 2^53 and an exact power of ten: one correctly rounded division, as Python's float())
    digits = text[1:] if text[:1] == "-" else text
    if digits.isascii():
        if digits.isdigit() and len(digits) <= 18 and text != "-0":
            return int(text)
        whole, dot, frac = digits.partition(".")
        if dot and whole.isdigit() and frac.isdigit() and len(whole) + len(frac) <= 15 and len(frac) <= 22:
            return float(text)
    m = _NUMBER.fullmatch(text)
    if m is None:  # pragma: no cover - the json module only hands over valid literals
        raise ValueError(f"invalid number {text!r}")
    positive = not text.startswith("-")
    int_digits, frac, exp_sign, exp_digits = m.group(1), m.group(2), m.group(3), m.group(4)
    significand = 0
    exponent = 0
    long_integer = False
    for ch in int_digits:
        d = ord(ch) - 48
        if long_integer or _overflows(significand, d, _U64_MAX):
            long_integer = True  # further integer digits only scale (parse_long_integer)
            exponent += 1
            continue
        significand = significand * 10 + d
    if frac is None and exp_digits is None:
        if long_integer:
            return _f64_from_parts(positive, significand, exponent)
        if positive:
            return significand
        if significand == 0 or significand > 1 << 63:  # "-0", or below i64::MIN
            return -float(significand)
        return -significand
    if frac is not None:
        for ch in frac:
            d = ord(ch) - 48
            if _overflows(significand, d, _U64_MAX):
                break  # the remaining decimals are ignored (parse_decimal_overflow)
            significand = significand * 10 + d
            exponent -= 1
    if exp_digits is not None:
        return _exponent(positive, significand, exponent, exp_sign, exp_digits)
    return _f64_from_parts(positive, significand, exponent)


def has_lone_surrogate(text: str) -> bool:
    """A string decoded by Python's ``json`` that held an escaped lone surrogate (``"\\ud800"``),
    which serde_json refuses in a string it deserializes."""
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def fields_once(on_twice):
    """A ``json.loads`` ``object_pairs_hook`` building a dict, which calls ``on_twice(key)`` (and
    raises what it returns) when a key comes a second time in one object."""

    def build(pairs):
        obj = {}
        for k, v in pairs:
            if k in obj:
                raise on_twice(k)
            obj[k] = v
        return obj

    return build


def no_json_constant(name: str):
    """A ``json.loads`` ``parse_constant`` hook: JSON has no ``NaN``, ``Infinity`` or
    ``-Infinity``, so the text is refused as invalid JSON, as serde_json refuses it."""
    raise ValueError(f"{name} is not JSON")
