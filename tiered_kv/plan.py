"""Capacity planning: how many pages and tokens of a model fit in each tier.

Pure arithmetic over a ``KVSpec``: the GPU holds bare page payloads, a host pool slot and an L3
record each cost the payload plus the 4 KiB record header, padded to 4 KiB (page_first).
"""

from __future__ import annotations

from dataclasses import dataclass

from .host_layouts import round_up
from .record import HEADER_BYTES
from .spec import KVSpec


@dataclass(frozen=True)
class TierPlan:
    name: str
    capacity_bytes: int
    bytes_per_page: int

    @property
    def pages(self) -> int:
        return self.capacity_bytes // self.bytes_per_page

    def tokens(self, page_size: int) -> int:
        return self.pages * page_size


def plan_tiers(spec: KVSpec, *, gpu_bytes: int, host_bytes: int, disk_bytes: int) -> list[TierPlan]:
    stored = round_up(HEADER_BYTES + spec.page_bytes)
    return [
        TierPlan("gpu", gpu_bytes, spec.page_bytes),
        TierPlan("host", host_bytes, stored),
        TierPlan("disk", disk_bytes, stored),
    ]


def plan_json(spec: KVSpec, tiers: list[TierPlan], model: str) -> dict:
    return {
        "model": model,
        "spec": spec.describe(),
        "fingerprint": spec.fingerprint,
        "layers": spec.num_layers,
        "page_size": spec.page_size,
        "bytes_per_token": spec.bytes_per_token,
        "page_bytes": spec.page_bytes,
        "stored_page_bytes": tiers[1].bytes_per_page,
        "components": {c.name: c.bytes_per_layer * spec.num_layers for c in spec.components},
        "tiers": {
            t.name: {"capacity_bytes": t.capacity_bytes, "pages": t.pages, "tokens": t.tokens(spec.page_size)}
            for t in tiers
        },
        **{t.name: {"pages": t.pages, "tokens": t.tokens(spec.page_size)} for t in tiers},
    }
