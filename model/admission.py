"""Admission stages: how a waiting request may enter the running set (spec §ADM).

Upstream: ``AdmissionStage`` / ``AdmissionInvariant`` in lib/mocker/src/scheduler/mod.rs:188-216.
"""

from __future__ import annotations

import enum

import attrs


class AdmissionStage(enum.Enum):
    """ADM-1: the stage a waiting candidate is in."""

    MATERIALIZED = "materialized"  # its prompt KV already exists (an activated destination)
    PENDING_DESTINATION_HEAD = "pending_destination_head"  # fresh KV needed, but a destination is pending
    FRESH_KV = "fresh_kv"  # fresh KV needed and nothing blocks it


@attrs.frozen
class AdmissionInvariant:
    """ADM-1: computed once per pass from whether any destination is pending."""

    pending_destination: bool

    def stage_for(self, materialized: bool) -> AdmissionStage:
        """ADM-1: materialized first; otherwise blocked while a destination is pending; else fresh."""
        if materialized:
            return AdmissionStage.MATERIALIZED
        if self.pending_destination:
            return AdmissionStage.PENDING_DESTINATION_HEAD
        return AdmissionStage.FRESH_KV
