"""SG-3: the written-out output-token hash equals SipHash-1-3 over the 32 hashed bytes."""

import random
import struct

from model import sglang_request as sr


def _reference(uuid16: bytes, output_len: int) -> int:
    return sr.siphash13(sr._LEN16 + uuid16 + struct.pack("<Q", output_len)) & 0xFFFFFFFF


def test_output_token_matches_siphash13_on_random_inputs():
    rng = random.Random(3)
    uuids = [rng.randbytes(16) for _ in range(300)] + [bytes(16), b"\xff" * 16]
    for u in uuids:
        for n in [0, 1, 2, 255, 256, 2**32 - 1, 2**32, 2**63, 2**64 - 1] + [rng.getrandbits(rng.randint(1, 64))
                                                                         for _ in range(40)]:
            assert sr.output_token(u, n) == _reference(u, n)


def test_output_token_prefix_table_stays_bounded():
    rng = random.Random(4)
    for _ in range(sr._PREFIX_STATES_MAX + 10):
        u = rng.randbytes(16)
        n = rng.randint(0, 4096)
        assert sr.output_token(u, n) == _reference(u, n)
        assert len(sr._PREFIX_STATES) <= sr._PREFIX_STATES_MAX


def test_output_token_other_lengths_use_the_general_hash():
    for u in (b"", b"abc", bytes(range(17))):
        assert sr.output_token(u, 7) == _reference(u, 7)
