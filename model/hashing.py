"""Block identities: XXH3-64 with seed 1337 (spec/kv-vllm.md, rules HASH-1..HASH-5).

These are the only hash functions the model uses.  They are pure and stable
across processes (no ``hash()``), so results do not depend on PYTHONHASHSEED.
"""

from __future__ import annotations

import struct
from typing import Iterable, Sequence

import xxhash

from model.errors import UpstreamPanic

#: seed of every XXH3 hash in the mocker (upstream ``CHAIN_XXH3_SEED`` / salt 1337)
XXH3_SEED = 1337

_U64 = struct.Struct("<Q")
_U64_PAIR = struct.Struct("<QQ")


def tokens_hash(tokens: Sequence[int]) -> int:
    """HASH-1: XXH3-64 (seed 1337) of the tokens as little-endian ``u32`` bytes.

    Raises ``OverflowError``/``struct.error`` for a token outside ``u32``
    (upstream panics there).
    """
    data = struct.pack(f"<{len(tokens)}I", *tokens)
    return xxhash.xxh3_64_intdigest(data, seed=XXH3_SEED)


def tokens_hasher(n: int):
    """HASH-1 for blocks of exactly ``n`` tokens: a function equal to :func:`tokens_hash` on them
    (the ``u32`` packing compiled once)."""
    pack = struct.Struct(f"<{n}I").pack
    digest = xxhash.xxh3_64_intdigest

    def block_hash(tokens: Sequence[int]) -> int:
        return digest(pack(*tokens), seed=XXH3_SEED)

    return block_hash


def chain_hash(parent: int, block_hash: int) -> int:
    """HASH-2: XXH3-64 (seed 1337) of ``le_u64(parent) ++ le_u64(block_hash)``."""
    return xxhash.xxh3_64_intdigest(_U64_PAIR.pack(parent, block_hash), seed=XXH3_SEED)


def block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """HASH-1 applied to every *full* block of ``tokens`` (a trailing partial block has none)."""
    n_full = len(tokens) // block_size
    return [tokens_hash(tokens[i * block_size:(i + 1) * block_size]) for i in range(n_full)]


def sequence_hashes(hashes: Iterable[int]) -> list[int]:
    """HASH-3: the chained sequence hashes of a run of block hashes.

    ``seq[0] = block_hash[0]`` and ``seq[i] = chain_hash(seq[i-1], block_hash[i])``.
    """
    out: list[int] = []
    for h in hashes:
        out.append(h if not out else chain_hash(out[-1], h))
    return out


# ---------------------------------------------------------------------------
# HASH-4: positional lineage hash (PLH), the identity of a registered block in
# the kvbm-logical pool and the key of the lineage eviction index.
# ---------------------------------------------------------------------------

#: (position bound, parent-fragment width in bits) for PLH modes 0, 1, 2
_PLH_MODES = ((1 << 8, 54), (1 << 16, 46), (1 << 24, 38))

_U64_MASK = (1 << 64) - 1
_FRAG54_MASK = (1 << 54) - 1  # fragment mask below position 256 (the common case of Plh.new)


def plh_fragment_bits(position: int) -> int:
    """HASH-4: width of the parent fragment a PLH at ``position`` stores.

    54 bits below position 256, 46 below 65 536, 38 from there on: upstream's mode choice has no
    upper bound (lib/tokens/src/lib.rs:665-673), so the fragment a node at position 2^24 - 1 is
    keyed by, for a child at 2^24, is 38 bits; only building a PLH at 2^24 or beyond panics
    (:meth:`Plh.new`).
    """
    if position < 256:
        return 54
    return 46 if position < 65536 else 38


def _plh_mode(position: int) -> int:
    for mode, (bound, _bits) in enumerate(_PLH_MODES):
        if position < bound:
            return mode
    raise OverflowError(f"PLH position {position} exceeds 2^24 - 1")


class Plh(tuple):
    """HASH-4: positional lineage hash as the triple it packs.

    ``(position, current, parent_fragment)``: the block position, the full
    64-bit sequence hash of the block, and the parent's sequence hash
    truncated to :func:`plh_fragment_bits` (0 for a root or when no parent is
    given).  Two PLHs are equal iff their 128-bit packings are equal, which is
    iff the three fields are equal, so the tuple equality is exact.
    """

    __slots__ = ()

    def __new__(cls, position: int, current: int, parent_fragment: int) -> "Plh":
        return tuple.__new__(cls, (position, current, parent_fragment))

    @classmethod
    def new(cls, current: int, parent: int | None, position: int) -> "Plh":
        """Build a PLH like ``PositionalLineageHash::new(current, parent, position)``, which panics
        for a position of 2^24 or more (lib/tokens/src/lib.rs:562-567)."""
        if position >= 1 << 24:
            raise UpstreamPanic(f"Position {position} exceeds maximum supported value (2^24 - 1 = 16,777,215)",
                                rule="HASH-4")
        mask = _FRAG54_MASK if position < 256 else (1 << plh_fragment_bits(position)) - 1
        return tuple.__new__(cls, (position, current & _U64_MASK, (parent or 0) & mask))

    @property
    def position(self) -> int:
        return self[0]

    @property
    def current(self) -> int:
        return self[1]

    @property
    def parent_fragment(self) -> int:
        return self[2]

    def fragment_for_child_position(self, child_position: int) -> int:
        """``current`` truncated to the fragment width a child at ``child_position`` stores."""
        return self[1] & ((1 << plh_fragment_bits(child_position)) - 1)

    def lineage_key(self) -> tuple[int, int]:
        """Key of this block's node in the lineage index: ``(position, own fragment)``."""
        pos = self[0]
        child = pos + 1
        if child < 256:  # plh_fragment_bits inlined (hot: every lineage-index operation)
            return (pos, self[1] & 0x3FFFFFFFFFFFFF)
        return (pos, self.fragment_for_child_position(child))

    def parent_key(self) -> tuple[int, int] | None:
        """Key of the parent node, ``(position - 1, parent_fragment)``; None at position 0."""
        if self[0] == 0:
            return None
        return (self[0] - 1, self[2])

    def as_u128(self) -> int:
        """The upstream 128-bit packing ``mode | position | current | parent_fragment``."""
        mode = _plh_mode(self[0])
        bits = _PLH_MODES[mode][1]
        pos_bits = (8, 16, 24)[mode]
        return (
            (mode << 126)
            | ((self[0] & ((1 << pos_bits) - 1)) << (64 + bits))
            | (self[1] << bits)
            | self[2]
        )

    def __repr__(self) -> str:
        return f"Plh(pos={self[0]}, cur={self[1]:#x}, parent={self[2]:#x})"


# ---------------------------------------------------------------------------
# HASH-5: deterministic stand-ins for upstream randomness (spec/kv-vllm.md)
# ---------------------------------------------------------------------------

_REQUEST_KEY_BYTES = 16


def _key_bytes(request_key: int) -> bytes:
    if not 0 <= request_key < (1 << 128):
        raise OverflowError(f"request key {request_key} is not a u128")
    return request_key.to_bytes(_REQUEST_KEY_BYTES, "little")


def generated_token(request_key: int, position: int) -> int:
    """HASH-5a: value (u32) of the model-generated token at ``position`` of a request."""
    data = b"T" + _key_bytes(request_key) + _U64.pack(position)
    return xxhash.xxh3_64_intdigest(data, seed=XXH3_SEED) & 0xFFFFFFFF


def generated_tokens(request_key: int, start: int, end: int) -> list[int]:
    """HASH-5a for the positions ``start..end-1``: ``[generated_token(request_key, i) ...]``."""
    prefix = b"T" + _key_bytes(request_key)
    pack = _U64.pack
    digest = xxhash.xxh3_64_intdigest
    return [digest(prefix + pack(i), seed=XXH3_SEED) & 0xFFFFFFFF for i in range(start, end)]


def generated_block_hash(tokens: Sequence[int], request_key: int) -> int:
    """HASH-5b: local hash of a block that holds at least one model-generated token.

    XXH3-64 (seed 1337) of the tokens as ``u32`` bytes followed by the 16-byte
    request key.  The input is 16 bytes longer than any HASH-1 input of the
    same block size, so it never equals a prompt block's input, and two
    requests with different keys never share an input.
    """
    data = struct.pack(f"<{len(tokens)}I", *tokens) + _key_bytes(request_key)
    return xxhash.xxh3_64_intdigest(data, seed=XXH3_SEED)


def private_block_id(tag: bytes, request_key: int, block_index: int) -> int:
    """HASH-5c: per-request block identity used when prefix caching is off.

    ``tag`` separates the uses (b"F" full-block id, b"P" PLH current hash).
    """
    data = tag + _key_bytes(request_key) + _U64.pack(block_index)
    return xxhash.xxh3_64_intdigest(data, seed=XXH3_SEED)
