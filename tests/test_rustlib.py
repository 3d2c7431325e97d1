"""model.rustlib: Rust's and serde_json's readings of text (spec/replay.md WL-2, WL-3;
spec/engine-args.md ARGS-10). Expected values are derived by hand from serde_json's algorithm
(an integer significand, then one multiplication or division by an f64 power of ten), and the
first one was also read back from the compiled build."""

import math

import pytest

from model.rustlib import RUST_WHITESPACE, has_lone_surrogate, rust_parse_f64, serde_json_number


def test_long_decimals_are_not_correctly_rounded():
    """WL-2: 64938497189547844 (exact as a u64) becomes the f64 64938497189547840, then / 1e12;
    correct rounding gives ...845. The build reads the trace timestamp as ...784."""
    assert serde_json_number("64938.497189547844") == float(64938497189547844) / 1e12 == 64938.49718954784
    assert float("64938.497189547844") != 64938.49718954784
    # the fast path is exact: short significands and small exponents agree with correct rounding
    for text in ("3.091", "0.1", "12345.678", "1E2", "2.5e-3"):
        assert serde_json_number(text) == float(text)


def test_integers_keep_their_integer_type_while_they_fit():
    """WL-2: a u64 when positive, an i64 when negative; otherwise an f64, and -0 is the float -0.0."""
    assert serde_json_number("18446744073709551615") == 2**64 - 1
    assert isinstance(serde_json_number("18446744073709551615"), int)
    assert serde_json_number("18446744073709551616") == float(2**64)
    assert serde_json_number("-9223372036854775808") == -(2**63)
    assert isinstance(serde_json_number("-9223372036854775809"), float)
    zero = serde_json_number("-0")
    assert isinstance(zero, float) and zero == 0.0 and math.copysign(1.0, zero) == -1.0


def test_digits_past_a_u64_only_scale_the_significand():
    """WL-2: 1 followed by 308 zeros keeps 10^19 as its significand and 289 as its exponent."""
    assert serde_json_number("1" + "0" * 308) == 1e19 * 1e289
    # the integer part overflows at its 20th digit (9 > 5), then ".3" still fits: 1844...613 / 10
    assert serde_json_number("18446744073709551619.3") == float(18446744073709551613)  # times 1e0


def test_out_of_range_and_underflow():
    for text in ("1e400", "1" + "0" * 309, "1e99999999999", "-1e400"):
        with pytest.raises(ValueError, match="number out of range"):
            serde_json_number(text)
    assert serde_json_number("1e-400") == 0.0
    assert serde_json_number("0e999999999999") == 0.0  # a zero significand never overflows
    assert serde_json_number("-1e-99999999999") == 0.0


def test_rust_f64_grammar():
    """ARGS-10: f64::from_str takes signs, inf/infinity/nan in any case, '5.' and '.5'; no blanks,
    underscores, hex or non-ASCII digits."""
    assert rust_parse_f64("5.") == 5.0 and rust_parse_f64(".5") == 0.5 and rust_parse_f64("+1E-5") == 1e-5
    assert math.isnan(rust_parse_f64("+nan")) and rust_parse_f64("-Infinity") == -math.inf
    for bad in ("", ".", "1_0", " 1", "0x1", "\u0660", "e5", "1e", "nan0"):
        with pytest.raises(ValueError):
            rust_parse_f64(bad)


def test_rust_whitespace_is_unicode_white_space():
    """WL-3, ARGS-10: str::trim removes U+3000 and U+0085 but not U+001C..U+001F, which Python's
    str.strip also removes."""
    assert "\u3000\x85 \t".strip(RUST_WHITESPACE) == ""
    assert "\x1c\x1d\x1e\x1f".strip(RUST_WHITESPACE) == "\x1c\x1d\x1e\x1f"
    assert "\x1c".strip() == ""


def test_lone_surrogates():
    assert has_lone_surrogate("a\ud800") and has_lone_surrogate("\udfff")
    assert not has_lone_surrogate("\U0001F600")


def test_fast_paths_agree_with_the_full_reading():
    """The short-integer and plain-decimal fast paths give what serde_json's full reading gives:
    a decimal with "e0" appended takes the full path and must read the same."""
    import random

    rng = random.Random(3)
    for _ in range(20000):
        text = f"{rng.choice(('', '-'))}{rng.randint(0, 10 ** rng.randint(1, 12))}.{rng.randint(0, 10 ** rng.randint(1, 14))}"
        assert serde_json_number(text) == serde_json_number(text + "e0"), text
    assert serde_json_number("123456789012345678") == 123456789012345678
    assert serde_json_number("-123456789012345678") == -123456789012345678


def test_fields_once_refuses_a_key_given_twice_and_keeps_order():
    """``fields_once``: the object hook of the scenario and step-trace readers (SCN-1, STEP-1)."""
    import json

    from model.rustlib import fields_once

    hook = fields_once(lambda k: KeyError(f"twice: {k}"))
    assert list(json.loads('{"b": 1, "a": {"b": 2}}', object_pairs_hook=hook)) == ["b", "a"]
    with pytest.raises(KeyError, match="twice: a"):
        json.loads('{"a": 1, "b": 2, "a": 1}', object_pairs_hook=hook)
    with pytest.raises(KeyError, match="twice: x"):  # in a nested object too
        json.loads('{"a": [{"x": 1, "x": 2}]}', object_pairs_hook=hook)
