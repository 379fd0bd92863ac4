"""Capacity planning: how many pages and tokens of a model fit in each tier.

Pure arithmetic over a ``KVSpec``. Three sizes of one page, named the same everywhere (``plan``
and ``bench storage`` print them with ``describe_page_sizes``):

    page payload    the page's bytes (every component and layer): what the GPU holds
    stored record   4 KiB record header + payload: what an L3 backend stores per page
    padded slot     the record padded to a multiple of 4 KiB: a page_first host pool slot, and
                    what the file backend writes (whole slots, for direct I/O)

The host and disk tiers are planned in padded slots.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.record import HEADER_BYTES
from ..model.sizes import round_up
from ..model.spec import KVSpec


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


def record_bytes(spec: KVSpec) -> int:
    """Stored record of one page: header + payload."""
    return HEADER_BYTES + spec.page_bytes


def slot_bytes(spec: KVSpec) -> int:
    """Padded slot of one page: the stored record rounded up to 4 KiB."""
    return round_up(record_bytes(spec))


def describe_page_sizes(spec: KVSpec) -> str:
    """The three sizes of a page, in the words the CLI uses for them everywhere."""
    return (f"page payload {spec.page_bytes:,} B; stored record {record_bytes(spec):,} B "
            f"(payload + {HEADER_BYTES // 1024} KiB header); padded slot {slot_bytes(spec):,} B (the record rounded up to 4 KiB)")


def plan_tiers(spec: KVSpec, *, gpu_bytes: int, host_bytes: int, disk_bytes: int) -> list[TierPlan]:
    stored = slot_bytes(spec)
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
        "record_bytes": record_bytes(spec),
        "slot_bytes": slot_bytes(spec),
        "stored_page_bytes": tiers[1].bytes_per_page,  # = slot_bytes; the name older readers use
        "components": {c.name: c.bytes_per_layer * spec.num_layers for c in spec.components},
        "tiers": {
            t.name: {"capacity_bytes": t.capacity_bytes, "bytes_per_page": t.bytes_per_page, "pages": t.pages,
                     "tokens": t.tokens(spec.page_size)}
            for t in tiers
        },
        **{t.name: {"pages": t.pages, "tokens": t.tokens(spec.page_size)} for t in tiers},
    }


# --- load or recompute -------------------------------------------------------------------------
@dataclass(frozen=True)
class TierCrossover:
    """Loading a prefix from one tier against recomputing it, per token of the prefix.

    ``bytes_per_token``: what the tier moves per token (L2 -> L1 the page payload; L3 -> L2 the
    padded slot, what the file backend reads). Loading beats recomputing when the tier delivers a
    token's bytes faster than the model computes the token: above ``crossover_gbps``.
    """

    tier: str
    bytes_per_token: float
    prefill_tokens_per_s: float
    gbps: float | None = None  # the tier's measured read bandwidth, if given

    @property
    def crossover_gbps(self) -> float:
        return self.bytes_per_token * self.prefill_tokens_per_s / 1e9

    @property
    def recompute_s_per_1k_tokens(self) -> float:
        return 1000 / self.prefill_tokens_per_s

    @property
    def load_s_per_1k_tokens(self) -> float | None:
        return None if self.gbps is None else 1000 * self.bytes_per_token / (self.gbps * 1e9)

    @property
    def beats_recompute(self) -> bool | None:
        return None if self.gbps is None else self.gbps > self.crossover_gbps

    def as_json(self) -> dict:
        return {"tier": self.tier, "bytes_per_token": self.bytes_per_token, "gbps": self.gbps,
                "crossover_gbps": self.crossover_gbps, "load_s_per_1k_tokens": self.load_s_per_1k_tokens,
                "recompute_s_per_1k_tokens": self.recompute_s_per_1k_tokens, "beats_recompute": self.beats_recompute}


def crossovers(spec: KVSpec, prefill_tokens_per_s: float, *, host_gbps: float | None = None,
               disk_gbps: float | None = None) -> list[TierCrossover]:
    """The host (L2) and disk (L3) tiers against a model that prefills ``prefill_tokens_per_s``
    tokens a second on this machine (at the context lengths that matter: the rate falls as
    attention grows), each with its measured read bandwidth where given."""
    return [TierCrossover("host", spec.page_bytes / spec.page_size, prefill_tokens_per_s, host_gbps),
            TierCrossover("disk", slot_bytes(spec) / spec.page_size, prefill_tokens_per_s, disk_gbps)]
