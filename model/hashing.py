"""Block identities: XXH3-64 with seed 1337 (spec/kv.md, rules HASH-1..HASH-3).

These are the only hash functions the model uses.  They are pure and stable
across processes (no ``hash()``), so results do not depend on PYTHONHASHSEED.
"""

from __future__ import annotations

import struct
from typing import Iterable, Sequence

import xxhash

#: seed of every XXH3 hash in the mocker (upstream ``CHAIN_XXH3_SEED`` / salt 1337)
XXH3_SEED = 1337

_U64 = struct.Struct("<Q")


def tokens_hash(tokens: Sequence[int]) -> int:
    """HASH-1: XXH3-64 (seed 1337) of the tokens as little-endian ``u32`` bytes.

    Raises ``OverflowError``/``struct.error`` for a token outside ``u32``
    (upstream panics there).
    """
    data = struct.pack(f"<{len(tokens)}I", *tokens)
    return xxhash.xxh3_64_intdigest(data, seed=XXH3_SEED)


def chain_hash(parent: int, block_hash: int) -> int:
    """HASH-2: XXH3-64 (seed 1337) of ``le_u64(parent) ++ le_u64(block_hash)``."""
    return xxhash.xxh3_64_intdigest(_U64.pack(parent) + _U64.pack(block_hash), seed=XXH3_SEED)


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
