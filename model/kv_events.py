"""KV cache events as a worker publishes them to the KV router (spec/kv-vllm.md, KV-20..KV-22).

Engine-neutral value types: the vLLM block manager (``model.vllm_kv``) and the
SGLang radix cache both describe their cache changes with these.  They mirror
the payload of upstream ``KvCacheEvent`` / ``KvCacheEventData`` (crate
dynamo-kv-router) as far as the mocker fills it in:

* ``start_position`` and ``mm_extra_info`` are always ``None`` in the mocker
  and are therefore not modelled;
* the storage tier is always "Device" in the default build (the host-pinned
  tier only exists with the kvbm-offload feature);
* ``token_ids`` is the per-block token payload that upstream hands to the raw
  (ZMQ) sink only; it is ``None`` unless token ids are emitted.
"""

from __future__ import annotations

from typing import Optional, Union

import attrs


@attrs.frozen
class StoredBlock:
    """One block of a Stored event.

    ``block_hash`` is the chained sequence hash (HASH-3) that the router keys
    its radix tree on; ``tokens_hash`` is the block's local content hash
    (HASH-1), or 0 when the publisher has none.
    """

    block_hash: int
    tokens_hash: int


@attrs.frozen
class KvStored:
    """Blocks newly cached on the device, as one chain hanging under ``parent_hash``.

    ``parent_hash`` is the sequence hash of the block the first stored block
    extends, or ``None`` when the first stored block is a root.
    """

    parent_hash: Optional[int]
    blocks: tuple[StoredBlock, ...]
    token_ids: Optional[tuple[tuple[int, ...], ...]] = None


@attrs.frozen
class KvRemoved:
    """Blocks no longer cached on the device, by sequence hash, in removal order."""

    block_hashes: tuple[int, ...]


KvEventData = Union[KvStored, KvRemoved]


@attrs.frozen
class KvCacheEvent:
    """One published event: ``event_id`` counts 0, 1, 2, ... per publishing manager."""

    event_id: int
    dp_rank: int
    data: KvEventData
