"""Per-request state of the SGLang core (spec/sglang-core.md SG-2, SG-3).

Upstream: lib/mocker/src/scheduler/sglang/request.rs at a822423412a0.

:class:`SglangRequest` is a frozen value; the core replaces it whenever a
field changes.  Token sequences are tuples of ints (prompt tokens widened to
u64 upstream, generated tokens are u32), slot lists are tuples of pool slot ids.
"""

from __future__ import annotations

import struct
import uuid as _uuid
from typing import Optional, Tuple

import attrs
import xxhash

from .ids import RequestId

_M64 = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _M64


def siphash13(data: bytes, k0: int = 0, k1: int = 0) -> int:
    """SipHash-1-3 (one compression round, three finalisation rounds), the algorithm of Rust's
    ``DefaultHasher``; keys ``(0, 0)`` as ``DefaultHasher::new()`` uses (SG-3)."""
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573

    def sipround(v0, v1, v2, v3):
        v0 = (v0 + v1) & _M64
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _M64
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _M64
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _M64
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
        return v0, v1, v2, v3

    n = len(data)
    full = n - n % 8
    for off in range(0, full, 8):
        m = int.from_bytes(data[off:off + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = sipround(v0, v1, v2, v3)
        v0 ^= m
    tail = int.from_bytes(data[full:], "little") if full < n else 0
    m = ((n & 0xFF) << 56) | tail
    v3 ^= m
    v0, v1, v2, v3 = sipround(v0, v1, v2, v3)
    v0 ^= m
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def uuid_bytes(request_id: RequestId) -> bytes:
    """The 16 bytes upstream hashes for a request uuid.  A model id that is not a UUID string
    (scenario names such as ``"X"``) stands for the UUID whose integer is the XXH3-128 of the id,
    the same stand-in the vLLM core uses for its request key."""
    try:
        return _uuid.UUID(request_id.value).bytes
    except ValueError:
        return xxhash.xxh3_128_intdigest(request_id.value.encode("utf-8")).to_bytes(16, "big")


_LEN16 = struct.pack("<Q", 16)


# SG-3 fast path: the output-token hash always reads 32 bytes (the length prefix 16, the uuid's
# 16 bytes, the output position), so its SipHash-1-3 is written out round by round, and the state
# after the first three words (a function of the uuid alone) is kept in a bounded table.
_SIP_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
_SIP_TAIL = 32 << 56  # the final block: the message length (32) in the top byte, no tail bytes
_PREFIX_STATES: dict = {}
_PREFIX_STATES_MAX = 4096


def _uuid_prefix_state(uuid16: bytes) -> Tuple[int, int, int, int]:
    """The SipHash-1-3 state after the words ``16``, ``uuid16[:8]``, ``uuid16[8:]`` (LE)."""
    v0, v1, v2, v3 = _SIP_INIT
    for m in (16, int.from_bytes(uuid16[:8], "little"), int.from_bytes(uuid16[8:], "little")):
        v3 ^= m
        v0 = (v0 + v1) & _M64
        v1 = (((v1 << 13) | (v1 >> 51)) & _M64) ^ v0
        v0 = ((v0 << 32) | (v0 >> 32)) & _M64
        v2 = (v2 + v3) & _M64
        v3 = (((v3 << 16) | (v3 >> 48)) & _M64) ^ v2
        v0 = (v0 + v3) & _M64
        v3 = (((v3 << 21) | (v3 >> 43)) & _M64) ^ v0
        v2 = (v2 + v1) & _M64
        v1 = (((v1 << 17) | (v1 >> 47)) & _M64) ^ v2
        v2 = ((v2 << 32) | (v2 >> 32)) & _M64
        v0 ^= m
    return v0, v1, v2, v3


def output_token(uuid16: bytes, output_len: int) -> int:
    """SG-3: the token a request generates at position ``output_len`` of its output: the low 32 bits
    of ``DefaultHasher`` over ``uuid.hash()`` (length prefix 16 as u64 LE, the 16 bytes) then
    ``output_len.hash()`` (u64 LE) (lib/mocker/src/scheduler/sglang/request.rs:76-81).

    Equal to ``siphash13(_LEN16 + uuid16 + struct.pack("<Q", output_len)) & 0xFFFFFFFF``."""
    if len(uuid16) != 16 or not 0 <= output_len <= _M64:
        return siphash13(_LEN16 + uuid16 + struct.pack("<Q", output_len)) & 0xFFFFFFFF
    state = _PREFIX_STATES.get(uuid16)
    if state is None:
        if len(_PREFIX_STATES) >= _PREFIX_STATES_MAX:
            _PREFIX_STATES.clear()
        state = _PREFIX_STATES[uuid16] = _uuid_prefix_state(uuid16)
    v0, v1, v2, v3 = state
    m = output_len
    v3 ^= m
    v0 = (v0 + v1) & _M64
    v1 = (((v1 << 13) | (v1 >> 51)) & _M64) ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & _M64
    v2 = (v2 + v3) & _M64
    v3 = (((v3 << 16) | (v3 >> 48)) & _M64) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = (((v3 << 21) | (v3 >> 43)) & _M64) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = (((v1 << 17) | (v1 >> 47)) & _M64) ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    v0 ^= m
    v3 ^= _SIP_TAIL
    v0 = (v0 + v1) & _M64
    v1 = (((v1 << 13) | (v1 >> 51)) & _M64) ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & _M64
    v2 = (v2 + v3) & _M64
    v3 = (((v3 << 16) | (v3 >> 48)) & _M64) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = (((v3 << 21) | (v3 >> 43)) & _M64) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = (((v1 << 17) | (v1 >> 47)) & _M64) ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    v0 ^= _SIP_TAIL
    v2 ^= 0xFF
    v0 = (v0 + v1) & _M64
    v1 = (((v1 << 13) | (v1 >> 51)) & _M64) ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & _M64
    v2 = (v2 + v3) & _M64
    v3 = (((v3 << 16) | (v3 >> 48)) & _M64) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = (((v3 << 21) | (v3 >> 43)) & _M64) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = (((v1 << 17) | (v1 >> 47)) & _M64) ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    v0 = (v0 + v1) & _M64
    v1 = (((v1 << 13) | (v1 >> 51)) & _M64) ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & _M64
    v2 = (v2 + v3) & _M64
    v3 = (((v3 << 16) | (v3 >> 48)) & _M64) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = (((v3 << 21) | (v3 >> 43)) & _M64) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = (((v1 << 17) | (v1 >> 47)) & _M64) ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    v0 = (v0 + v1) & _M64
    v1 = (((v1 << 13) | (v1 >> 51)) & _M64) ^ v0
    v0 = ((v0 << 32) | (v0 >> 32)) & _M64
    v2 = (v2 + v3) & _M64
    v3 = (((v3 << 16) | (v3 >> 48)) & _M64) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = (((v3 << 21) | (v3 >> 43)) & _M64) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = (((v1 << 17) | (v1 >> 47)) & _M64) ^ v2
    v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    return (v0 ^ v1 ^ v2 ^ v3) & 0xFFFFFFFF


def ceil_to_block(tokens: int, block_size: int) -> int:
    """SG-1: ``0`` for ``0``, else the next multiple of ``block_size`` (config.rs:100-106)."""
    if tokens == 0:
        return 0
    return -(-tokens // block_size) * block_size


def floor_to_block(tokens: int, block_size: int) -> int:
    """SG-1: the previous multiple of ``block_size`` (config.rs:108-110)."""
    return tokens // block_size * block_size


@attrs.frozen(slots=True)
class SglangRequest:
    """SG-2: a request as the SGLang scheduler holds it (request.rs:12-23).

    ``last_node`` is the radix node the request holds a lock on (``None``: no lock, the root: a
    lock that locks nothing); ``kv_indices`` one pool slot per materialized token;
    ``cached_tokens`` the page-aligned prefix the request itself inserted into the tree;
    ``allocated_tokens`` the page-rounded logical allocation.
    """

    uuid: RequestId
    prompt: Tuple[int, ...]
    max_output_tokens: int
    output_ids: Tuple[int, ...] = ()
    last_node: Optional[int] = None
    kv_indices: Tuple[int, ...] = ()
    materialized_tokens: int = 0
    cached_tokens: int = 0
    allocated_tokens: int = 0
    #: the uuid's 16 bytes (cached input of the output-token hash; derived from ``uuid``)
    uuid16: bytes = attrs.field(default=b"", eq=False, repr=False)

    # -- derived quantities (request.rs:26-59) --

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def output_len(self) -> int:
        return len(self.output_ids)

    @property
    def current_sequence_len(self) -> int:
        return len(self.prompt) + len(self.output_ids)

    @property
    def extend_input_len(self) -> int:
        return max(self.current_sequence_len - self.materialized_tokens, 0)

    @property
    def remaining_output_tokens(self) -> int:
        return max(self.max_output_tokens - len(self.output_ids), 0)

    @property
    def extra_reserved_tokens(self) -> int:
        return max(self.allocated_tokens - len(self.kv_indices), 0)

    def sequence_tokens(self) -> Tuple[int, ...]:
        return self.prompt + self.output_ids if self.output_ids else self.prompt

    def sequence_prefix(self, n: int) -> Tuple[int, ...]:
        p = len(self.prompt)
        if n <= p:
            return self.prompt if n == p else self.prompt[:n]
        return self.prompt + self.output_ids[: n - p]

    def next_output_token(self) -> int:
        return output_token(self.uuid16 or uuid_bytes(self.uuid), len(self.output_ids))

    def reset_for_retract(self) -> "SglangRequest":
        """SG-24: drop every KV field; the outputs are kept (request.rs:151-157)."""
        return SglangRequest(self.uuid, self.prompt, self.max_output_tokens, self.output_ids,
                             None, (), 0, 0, 0, self.uuid16)

    def field_problems(self, block_size: int) -> Optional[str]:
        """SG-2: upstream's ``debug_assert_invariants`` (request.rs:88-149), or ``None``."""
        seq = self.current_sequence_len
        m = self.materialized_tokens
        if self.cached_tokens > m:
            return f"cached {self.cached_tokens} > materialized {m}"
        if m > seq:
            return f"materialized {m} > sequence length {seq}"
        if len(self.kv_indices) != m:
            return f"{len(self.kv_indices)} kv indices but {m} materialized tokens"
        if self.allocated_tokens < m:
            return f"allocated {self.allocated_tokens} < materialized {m}"
        if self.cached_tokens % block_size:
            return f"cached tokens {self.cached_tokens} not page aligned"
        if self.allocated_tokens % block_size:
            return f"allocated tokens {self.allocated_tokens} not page aligned"
        if self.extra_reserved_tokens >= block_size:
            return f"reserves {self.extra_reserved_tokens} extra tokens"
        if (self.last_node is not None) != (m > 0):
            return f"last_node {self.last_node} with {m} materialized tokens"
        return None


def new_request(uuid: RequestId, tokens, max_output_tokens: int) -> SglangRequest:
    """SG-2: ``SglangRequest::from(DirectRequest)`` (request.rs:160-174)."""
    return SglangRequest(uuid, tuple(tokens), max_output_tokens, uuid16=uuid_bytes(uuid))
