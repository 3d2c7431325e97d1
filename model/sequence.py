"""The per-request token sequence of the vLLM core (spec/kv-vllm.md, rules SEQ-1..SEQ-12).

An :class:`ActiveSequence` is a frozen value: the prompt, the tokens generated
so far, the request's *unique blocks* (the identities under which its blocks
are held by the KV manager) and the allocation watermark.  Operations return a
new sequence and, where upstream does, the block signals (:class:`Use`,
:class:`Deref`, :class:`Promote`) that the caller hands to the KV manager.

Upstream draws generated tokens and some block ids from an unseeded RNG.  The
model replaces every draw by a deterministic function of the request key and
a position (SEQ-2, HASH-5); see spec/kv-vllm.md §2.2 for why this preserves
every behaviour the scheduler can observe.
"""

from __future__ import annotations

from typing import Optional, Union

import attrs
from pyrsistent import PVector, pvector

from model.errors import InternalInvariantBroken, InvalidInput
from model.hashing import (
    Plh,
    chain_hash,
    generated_block_hash,
    generated_token,
    generated_tokens,
    private_block_id,
    tokens_hash,
    tokens_hasher,
)

# ---------------------------------------------------------------------------
# Block identities and signals
# ---------------------------------------------------------------------------


@attrs.frozen
class FullBlock:
    """A full block, identified by its sequence hash (or a private id, SEQ-4)."""

    seq_hash: int


@attrs.frozen
class PartialBlock:
    """The trailing, still-filling block of a request (SEQ-5).

    Upstream names it by a random v4 uuid.  The model names it by the owning
    request key and the block index; any hashable pair works for the KV
    manager, which only compares these ids for equality.
    """

    owner: int
    index: int


UniqueBlock = Union[FullBlock, PartialBlock]


@attrs.frozen
class Use:
    """Hold ``blocks`` (allocate or re-reference them), in order (KV-6).

    ``hashes`` (local block hashes), ``plhs`` and ``token_ids`` describe the
    *full* blocks of ``blocks`` one-to-one (``hashes`` may be empty, e.g. with
    prefix caching off); ``parent`` is the block just before ``blocks[0]`` in
    the request, or ``None``.
    """

    blocks: tuple[UniqueBlock, ...]
    hashes: tuple[int, ...] = ()
    plhs: tuple[Plh, ...] = ()
    token_ids: Optional[tuple[tuple[int, ...], ...]] = None
    parent: Optional[UniqueBlock] = None


@attrs.frozen
class Deref:
    """Drop one reference to each of ``blocks``, in order (KV-9)."""

    blocks: tuple[UniqueBlock, ...]


@attrs.frozen
class Promote:
    """Turn the partial block ``partial`` into the full block ``seq_hash`` (KV-10)."""

    partial: PartialBlock
    seq_hash: int
    parent_hash: Optional[int]
    local_hash: Optional[int]
    plh: Plh
    token_ids: Optional[tuple[int, ...]] = None


Signal = Union[Use, Deref, Promote]

#: marker stored in ``ActiveSequence.generated`` for a model-generated token (SEQ-2)
_MODEL_TOKEN = None

_U32_MAX = 0xFFFFFFFF


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------
# The sequence value
# ---------------------------------------------------------------------------


@attrs.frozen
class ActiveSequence:
    """SEQ-1: the state of one request's token sequence.

    ``generated`` holds one entry per generated token: an explicit ``u32``
    value (pushed with :func:`push`) or ``None`` for a model-generated token
    whose value is :func:`model.hashing.generated_token` of
    ``(request_key, position)``.

    Invariants (checked by the tests): ``len(unique_blocks) ==
    ceil(len / block_size)`` except transiently between a completed block and
    the next push (SEQ-7); the full blocks precede at most one trailing
    partial block; ``len(plhs)`` equals the number of full blocks; with prefix
    caching on ``len(block_hashes) == len(plhs)``, with it off
    ``block_hashes`` is empty.
    """

    request_key: int
    prompt: tuple[int, ...]
    block_size: int
    max_output_tokens: int
    enable_prefix_caching: bool
    emit_token_ids: bool
    generated: PVector
    num_allocated_tokens: int
    unique_blocks: PVector
    block_hashes: PVector
    plhs: PVector

    # -- derived quantities -------------------------------------------------

    @property
    def num_input_tokens(self) -> int:
        return len(self.prompt)

    @property
    def generated_tokens(self) -> int:
        return len(self.generated)

    def __len__(self) -> int:
        return len(self.prompt) + len(self.generated)

    @property
    def extra_tokens(self) -> int:
        """SEQ-12: tokens in the trailing partial block, ``len % block_size``."""
        return len(self) % self.block_size

    def current_known_blocks(self) -> int:
        """SEQ-12: ``ceil(len / block_size)``, the footprint of the tokens known so far."""
        return _ceil_div(len(self), self.block_size)

    def to_completion_blocks(self) -> int:
        """SEQ-12: ``ceil((P + M) / block_size)``, the footprint at completion (TRT-LLM gate)."""
        return _ceil_div(len(self.prompt) + self.max_output_tokens, self.block_size)

    def token_at(self, position: int) -> int:
        """The token value at ``position`` (SEQ-2)."""
        p = len(self.prompt)
        if position < p:
            return self.prompt[position]
        tok = self.generated[position - p]
        if tok is _MODEL_TOKEN:
            return generated_token(self.request_key, position)
        return tok

    def block_tokens(self, index: int) -> tuple[int, ...]:
        """Tokens of full block ``index`` (``token_at`` of each position, model tokens hashed in one batch)."""
        bs = self.block_size
        start, end = index * bs, (index + 1) * bs
        p = len(self.prompt)
        if end <= p:
            return self.prompt[start:end]
        gen = self.generated
        lo = max(start, p)
        out = list(self.prompt[start:p]) if start < p else []
        explicit = gen[lo - p:end - p]
        if len(explicit) != end - lo:  # past the known tokens: token_at raises
            return tuple(self.token_at(i) for i in range(start, end))
        if all(t is _MODEL_TOKEN for t in explicit):
            out.extend(generated_tokens(self.request_key, lo, end))
        else:
            for i, tok in enumerate(explicit, lo):
                out.append(generated_token(self.request_key, i) if tok is _MODEL_TOKEN else tok)
        return tuple(out)

    def _block_local_hash(self, index: int) -> int:
        """HASH-1 for a block of explicit tokens; HASH-5b if it holds a model-generated token."""
        bs = self.block_size
        start, end = index * bs, (index + 1) * bs
        toks = self.block_tokens(index)
        p = len(self.prompt)
        if end > p:
            for j in range(max(start, p), end):
                if self.generated[j - p] is _MODEL_TOKEN:
                    return generated_block_hash(toks, self.request_key)
        return tokens_hash(toks)


def _replace(seq: ActiveSequence, generated=None, num_allocated_tokens=None, unique_blocks=None,
             block_hashes=None, plhs=None) -> ActiveSequence:
    """Fast ``attrs.evolve`` for the fields that operations change."""
    return ActiveSequence(
        seq.request_key,
        seq.prompt,
        seq.block_size,
        seq.max_output_tokens,
        seq.enable_prefix_caching,
        seq.emit_token_ids,
        seq.generated if generated is None else generated,
        seq.num_allocated_tokens if num_allocated_tokens is None else num_allocated_tokens,
        seq.unique_blocks if unique_blocks is None else unique_blocks,
        seq.block_hashes if block_hashes is None else block_hashes,
        seq.plhs if plhs is None else plhs,
    )


# ---------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------


#: SEQ-3 / HASH-1..HASH-3: ``(parent sequence hash, block index, the block's u32 tokens)`` ->
#: ``(local hash, sequence hash, FullBlock, Plh)`` of a prompt block with prefix caching: a bounded
#: table of a pure function of its key (prompts that share a prefix share these immutable values)
_PROMPT_BLOCKS: dict = {}
_PROMPT_BLOCKS_MAX = 1 << 15


def new_sequence(
    request_key: int,
    prompt,
    max_output_tokens: int,
    block_size: int = 64,
    enable_prefix_caching: bool = True,
    emit_token_ids: bool = False,
) -> ActiveSequence:
    """SEQ-3/SEQ-4/SEQ-5: build the sequence of a new request.

    Rule: SEQ-3.  ``block_size`` must be at least 2 (upstream validator) and
    every token a ``u32``.  ``emit_token_ids`` only takes effect with prefix
    caching on.  ``request_key`` must be unique among the requests of one KV
    manager (SEQ-2).
    """
    if block_size < 2:
        raise InvalidInput("block_size", block_size, "the vLLM sequence needs block_size >= 2", rule="SEQ-3")
    if max_output_tokens < 0:
        raise InvalidInput("max_output_tokens", max_output_tokens, "must be >= 0", rule="SEQ-3")
    if not 0 <= request_key < (1 << 128):
        raise InvalidInput("request_key", request_key, "must be a u128", rule="SEQ-2")
    prompt = tuple(prompt)
    # all ints within [0, u32]: checked by min/max; anything else by the per-token loop
    plain = not prompt or (set(map(type, prompt)) == {int} and min(prompt) >= 0 and max(prompt) <= _U32_MAX)
    if not plain:
        for t in prompt:
            if not 0 <= t <= _U32_MAX:
                raise InvalidInput("token", t, "token ids are u32", rule="SEQ-3")

    n_full = len(prompt) // block_size
    blocks: list[UniqueBlock] = []
    hashes: list[int] = []
    plhs: list[Plh] = []
    parent: Optional[int] = None
    block_hash = tokens_hasher(block_size) if enable_prefix_caching and n_full else None
    cache = _PROMPT_BLOCKS if plain else None
    for i in range(n_full):
        if block_hash is not None:
            toks = prompt[i * block_size:(i + 1) * block_size]
            hit = cache.get((parent, i, toks)) if cache is not None else None
            if hit is None:
                local = block_hash(toks)
                seq = local if parent is None else chain_hash(parent, local)
                hit = (local, seq, FullBlock(seq), Plh.new(seq, parent, i))
                if cache is not None:
                    if len(cache) >= _PROMPT_BLOCKS_MAX:
                        cache.clear()
                    cache[(parent, i, toks)] = hit
            local, seq, full, plh = hit
            hashes.append(local)
            blocks.append(full)
            plhs.append(plh)
            parent = seq
        else:
            blocks.append(FullBlock(private_block_id(b"F", request_key, i)))
            plhs.append(Plh.new(private_block_id(b"P", request_key, i), None, i))
    if len(prompt) % block_size:
        blocks.append(PartialBlock(request_key, n_full))

    return ActiveSequence(
        request_key=request_key,
        prompt=prompt,
        block_size=block_size,
        max_output_tokens=max_output_tokens,
        enable_prefix_caching=enable_prefix_caching,
        emit_token_ids=emit_token_ids and enable_prefix_caching,
        generated=pvector(),
        num_allocated_tokens=0,
        unique_blocks=pvector(blocks),
        block_hashes=pvector(hashes),
        plhs=pvector(plhs),
    )


# ---------------------------------------------------------------------------
# Allocation
# ---------------------------------------------------------------------------


def prepare_allocation(seq: ActiveSequence, cumulative_tokens: int) -> Optional[Use]:
    """SEQ-6: the Use signal that holds the blocks for ``cumulative_tokens`` tokens.

    Rule: SEQ-6.  Pure: the sequence does not change until
    :func:`commit_allocation`.  Returns ``None`` when no new block is needed.
    """
    bs = seq.block_size
    n_ub = len(seq.unique_blocks)
    prev = min(_ceil_div(seq.num_allocated_tokens, bs), n_ub)
    target = min(_ceil_div(cumulative_tokens, bs), n_ub)
    if target <= prev:
        return None
    blocks = tuple(seq.unique_blocks[prev:target])
    nh = len(seq.block_hashes)
    h0, h1 = min(prev, nh), min(target, nh)
    hashes = tuple(seq.block_hashes[h0:h1])
    npl = len(seq.plhs)
    plhs = tuple(seq.plhs[min(prev, npl):min(target, npl)])
    token_ids = None
    if seq.emit_token_ids and h0 < h1:
        token_ids = tuple(seq.block_tokens(i) for i in range(h0, h1))
    parent = seq.unique_blocks[prev - 1] if prev > 0 else None
    return Use(blocks, hashes, plhs, token_ids, parent)


def commit_allocation(seq: ActiveSequence, cumulative_tokens: int) -> ActiveSequence:
    """SEQ-6: record that the blocks for ``cumulative_tokens`` tokens are held.

    Rule: SEQ-6.  A plain assignment, as upstream: it may also lower the
    watermark.
    """
    if cumulative_tokens < 0:
        raise InternalInvariantBroken("commit_allocation: negative token count", rule="SEQ-6")
    return _replace(seq, num_allocated_tokens=cumulative_tokens)


def with_allocated(seq: ActiveSequence, cumulative_tokens: int) -> ActiveSequence:
    """:func:`commit_allocation` for ``cumulative_tokens >= 0`` (the engine core's hot path)."""
    return _replace(seq, num_allocated_tokens=cumulative_tokens)


def allocate_blocks_for_chunk(seq: ActiveSequence, cumulative_tokens: int) -> tuple[ActiveSequence, Optional[Use]]:
    """SEQ-6: prepare and commit in one step (paths where failure is impossible)."""
    signal = prepare_allocation(seq, cumulative_tokens)
    return commit_allocation(seq, cumulative_tokens), signal


def take_creation_signal(seq: ActiveSequence) -> tuple[ActiveSequence, Optional[Use]]:
    """SEQ-6: allocate every block of the current tokens at once."""
    return allocate_blocks_for_chunk(seq, len(seq))


# ---------------------------------------------------------------------------
# Growth and shrinkage
# ---------------------------------------------------------------------------


def push(seq: ActiveSequence, token: Optional[int] = None) -> tuple[ActiveSequence, tuple[Signal, ...]]:
    """SEQ-7: append one generated token and return the block signals it causes.

    Rule: SEQ-7.  ``token=None`` appends the model-generated token (SEQ-2); an
    explicit ``u32`` is accepted for tests that replay upstream histories.
    Signals are emitted only when the new token opens a block
    (``len % block_size == 1``): first a :class:`Promote` of the previous
    partial block (if the last unique block is partial), then a :class:`Use`
    of the new partial block.  Returns ``()`` otherwise.
    """
    if token is not None and not 0 <= token <= _U32_MAX:
        raise InvalidInput("token", token, "token ids are u32", rule="SEQ-7")
    bs = seq.block_size
    generated = seq.generated.append(token)
    length = len(seq.prompt) + len(generated)
    if length % bs != 1:
        return _replace(seq, generated=generated), ()

    seq1 = _replace(seq, generated=generated)
    blocks = seq.unique_blocks
    hashes = seq.block_hashes
    plhs = seq.plhs
    signals: list[Signal] = []
    last = blocks[-1] if blocks else None
    if isinstance(last, PartialBlock):
        # the block that just completed is the one before the new token
        index = (length - 1) // bs - 1
        parent_block = blocks[-2] if len(blocks) >= 2 else None
        if isinstance(parent_block, PartialBlock):
            raise InternalInvariantBroken("a partial block cannot be a parent", rule="SEQ-7")
        parent_hash = parent_block.seq_hash if parent_block is not None else None
        if seq.enable_prefix_caching:
            local = seq1._block_local_hash(index)
            seq_hash = local if parent_hash is None else chain_hash(parent_hash, local)
            plh = Plh.new(seq_hash, parent_hash, index)
            local_hash: Optional[int] = local
            hashes = hashes.append(local)
        else:
            seq_hash = private_block_id(b"F", seq.request_key, len(plhs))
            plh = Plh.new(private_block_id(b"P", seq.request_key, len(plhs)), None, len(plhs))
            local_hash = None
        token_ids = seq1.block_tokens(index) if seq.emit_token_ids else None
        plhs = plhs.append(plh)
        blocks = blocks.set(len(blocks) - 1, FullBlock(seq_hash))
        signals.append(Promote(last, seq_hash, parent_hash, local_hash, plh, token_ids))

    new_partial = PartialBlock(seq.request_key, (length - 1) // bs)
    blocks = blocks.append(new_partial)
    signals.append(Use((new_partial,)))
    return (
        _replace(seq1, unique_blocks=blocks, block_hashes=hashes, plhs=plhs),
        tuple(signals),
    )


def _free_signals(seq: ActiveSequence, active_tokens: int) -> tuple[Deref, ...]:
    n = min(_ceil_div(active_tokens, seq.block_size), len(seq.unique_blocks))
    return tuple(Deref((seq.unique_blocks[i],)) for i in range(n - 1, -1, -1))


def generate(seq: ActiveSequence) -> tuple[ActiveSequence, tuple[Signal, ...]]:
    """SEQ-8: generate one token; on the last one also release every block.

    Rule: SEQ-8.  Requires ``generated_tokens < max_output_tokens``.  The
    signals are those of :func:`push`, followed, when the request reaches
    ``max_output_tokens``, by one single-block :class:`Deref` per block of the
    ``ceil(len / block_size)`` current blocks, last block first.
    """
    if len(seq.generated) >= seq.max_output_tokens:
        raise InternalInvariantBroken(
            "cannot generate more tokens: reached max_output_tokens", rule="SEQ-8"
        )
    seq2, signals = push(seq)
    if len(seq2.generated) != seq2.max_output_tokens:
        return seq2, signals
    return seq2, signals + _free_signals(seq2, len(seq2))


def generate_quiet(seq: ActiveSequence) -> Optional[ActiveSequence]:
    """SEQ-7/SEQ-8 fast path: the sequence :func:`generate` returns when it returns no signal
    (the new token opens no block and is not the last one), else ``None``.

    Equal to ``generate(seq)[0]`` whenever ``generate(seq)[1] == ()``; the engine core calls it
    once per decoding request per pass before falling back to :func:`generate`.
    """
    gen = seq.generated
    n_gen = len(gen) + 1
    if n_gen >= seq.max_output_tokens or (len(seq.prompt) + n_gen) % seq.block_size == 1:
        return None
    return _replace(seq, generated=gen.append(_MODEL_TOKEN))


def generate_quiet_in_place(seq: ActiveSequence) -> bool:
    """:func:`generate_quiet` for a sequence that a transaction created and nobody else has seen:
    the token is appended to ``seq`` itself (its new ``generated``) and True returned, or False
    (``seq`` untouched) when :func:`generate` would return signals.  Only for transaction-local
    values, before they are published."""
    gen = seq.generated
    n_gen = len(gen) + 1
    if n_gen >= seq.max_output_tokens or (len(seq.prompt) + n_gen) % seq.block_size == 1:
        return False
    object.__setattr__(seq, "generated", gen.append(_MODEL_TOKEN))
    return True


def free_signal(seq: ActiveSequence) -> tuple[Deref, ...]:
    """SEQ-9: Derefs for the allocated footprint ``ceil(num_allocated / bs)``, last first."""
    return _free_signals(seq, seq.num_allocated_tokens)


def reset_with_signal(seq: ActiveSequence) -> tuple[ActiveSequence, tuple[Deref, ...]]:
    """SEQ-10: preemption reset: free the allocated blocks and zero the watermark.

    Rule: SEQ-10.  Tokens (generated ones included) and unique blocks are
    kept, so re-admission re-matches the request's own blocks.
    """
    return _replace(seq, num_allocated_tokens=0), free_signal(seq)


def pop(seq: ActiveSequence) -> ActiveSequence:
    """SEQ-11: undo the last generated token.

    Rule: SEQ-11.  Only meant to undo a token whose new partial block could
    not be allocated; when the length returns to a block boundary the
    trailing unique block is dropped (a Promote that already happened stays).
    """
    if not seq.generated:
        raise InternalInvariantBroken("pop: no generated token to undo", rule="SEQ-11")
    generated = seq.generated.delete(len(seq.generated) - 1)
    blocks = seq.unique_blocks
    if (len(seq.prompt) + len(generated)) % seq.block_size == 0 and blocks:
        blocks = blocks.delete(len(blocks) - 1)
    return _replace(seq, generated=generated, unique_blocks=blocks)
