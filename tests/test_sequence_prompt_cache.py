"""SEQ-3: prompt blocks served from the bounded prompt-block table equal freshly computed ones."""

import random
import struct

import pytest

from model import sequence as seqm


def _fresh(*args, **kwargs):
    saved = dict(seqm._PROMPT_BLOCKS)
    seqm._PROMPT_BLOCKS.clear()
    try:
        return seqm.new_sequence(*args, **kwargs)
    finally:
        seqm._PROMPT_BLOCKS.clear()
        seqm._PROMPT_BLOCKS.update(saved)


def test_shared_prefix_prompts_match_fresh_construction():
    rng = random.Random(11)
    bases = [[rng.randint(0, 2**32 - 1) for _ in range(200)] for _ in range(3)]
    for k in range(60):
        base = bases[k % 3]
        prompt = base[: rng.randint(0, 200)] + [rng.randint(0, 50) for _ in range(rng.randint(0, 40))]
        bs = rng.choice([2, 4, 16])
        key = rng.getrandbits(128)
        cached = seqm.new_sequence(key, prompt, 8, block_size=bs)
        assert cached == _fresh(key, prompt, 8, block_size=bs)
        assert (cached.unique_blocks, cached.block_hashes, cached.plhs) == (
            _fresh(key, prompt, 8, block_size=bs).unique_blocks,
            _fresh(key, prompt, 8, block_size=bs).block_hashes,
            _fresh(key, prompt, 8, block_size=bs).plhs,
        )
    assert len(seqm._PROMPT_BLOCKS) <= seqm._PROMPT_BLOCKS_MAX


def test_non_int_tokens_are_still_rejected_after_equal_int_prompts_were_cached():
    seqm.new_sequence(1, [1, 2, 3, 4], 4, block_size=2)
    with pytest.raises(struct.error):
        seqm.new_sequence(2, [1.0, 2, 3, 4], 4, block_size=2)
