"""The hierarchy's policies as frozen values: what is written where and when, and how long a
request waits for its prefetch.

Write policies (L1 -> L2, acting on the engine's L1 events):
    write_through              store a page on L2 as soon as the engine inserts it on L1
    write_through_selective    store it once it was hit ``selective_hits`` times on L1
    write_back                 store it when the engine is about to evict it from L1

L2 -> L3 follows once a page is sealed on L2 (``write_through*``), or when L2 is about to evict
the page's last copy (``write_back``); either way only pages hit at least ``l3_admission_hits``
times are admitted to L3 (0: every page; Dynamo KVBM admits on the second hit to spare SSDs).

Prefetch policies (L3 -> L2 while a request waits):
    best_effort      use what has landed when the request is scheduled, drop the rest
    wait_complete    the request waits until the whole prefetch has landed (or failed)
    timeout          wait at most min(max_s, base_s + per_1k_tokens_s x tokens / 1000), where
                     tokens are those the prefetch reads from L3 (what the request waits for)

A lookup waits for L3's ``exists`` as its prefetch policy waits for reads: ``best_effort`` at most
``lookup_wait_s``, ``timeout`` at most the larger of that and the policy's wait for the tokens
asked of L3, ``wait_complete`` until L3 answers (or its backend's timeout degrades the tier). A
lookup that gives up decides without L3 (a slow or hung medium cost requests the socket timeout).

Pure data and arithmetic: no I/O, no clocks, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ..errors import ConfigError


class WritePolicy(str, Enum):
    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


class PrefetchPolicy(str, Enum):
    BEST_EFFORT = "best_effort"
    WAIT_COMPLETE = "wait_complete"
    TIMEOUT = "timeout"


def _enum(kind: type[Enum], value: object, what: str) -> Enum:
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{what} must be one of {', '.join(m.value for m in kind)}, got {value!r}") from None


def _finite(value: object, what: str, *, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
        raise ConfigError(f"{what} must be a finite number >= {low}, got {value!r}")
    return float(value)


def _count(value: object, what: str, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{what} must be an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class PrefetchTimeout:
    """``timeout`` policy: wait at most ``min(max_s, base_s + per_1k_tokens_s * tokens / 1000)``."""

    base_s: float = 0.005
    per_1k_tokens_s: float = 0.002
    max_s: float = 1.0

    def __post_init__(self) -> None:
        _finite(self.base_s, "prefetch timeout base_s")
        _finite(self.per_1k_tokens_s, "prefetch timeout per_1k_tokens_s")
        _finite(self.max_s, "prefetch timeout max_s")

    def for_tokens(self, tokens: int) -> float:
        return min(self.max_s, self.base_s + self.per_1k_tokens_s * tokens / 1000.0)


@dataclass(frozen=True)
class Policies:
    """Every knob the index and the manager act on. Defaults: write through, best-effort prefetch."""

    write: WritePolicy = WritePolicy.WRITE_THROUGH
    selective_hits: int = 2  # write_through_selective: L1 hits before a page goes to L2
    l3_admission_hits: int = 0  # a page goes to L3 only once hit this often (0: always)
    prefetch: PrefetchPolicy = PrefetchPolicy.BEST_EFFORT
    prefetch_timeout: PrefetchTimeout = PrefetchTimeout()
    min_hit_tokens: int = 0  # an L2 / L3 hit shorter than this is not worth loading: recompute
    l3_writer: bool = True  # replicated MLA / NSA caches: only one rank writes L3
    agree_deadline_s: float = 2.0  # the agree hook's answer is waited for this long; then no hit, recompute
    # best_effort / timeout: L3's exists is waited for this long, then the lookup decides without
    # L3. As long as the timeout policy's longest wait (PrefetchTimeout.max_s) and far above an
    # exists' usual milliseconds, so a loaded host or a server back from a pause keeps its hits.
    lookup_wait_s: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "write", _enum(WritePolicy, self.write, "write policy"))
        object.__setattr__(self, "prefetch", _enum(PrefetchPolicy, self.prefetch, "prefetch policy"))
        _count(self.selective_hits, "selective_hits", low=1)
        _count(self.l3_admission_hits, "l3_admission_hits")
        _count(self.min_hit_tokens, "min_hit_tokens")
        if _finite(self.agree_deadline_s, "agree_deadline_s") == 0:  # every lookup would give up: no hit ever
            raise ConfigError(f"agree_deadline_s must be > 0, got {self.agree_deadline_s!r}")
        if _finite(self.lookup_wait_s, "lookup_wait_s") == 0:  # no lookup would ever hear from L3
            raise ConfigError(f"lookup_wait_s must be > 0, got {self.lookup_wait_s!r}")
        if not isinstance(self.prefetch_timeout, PrefetchTimeout):
            raise ConfigError(f"prefetch_timeout must be a PrefetchTimeout, got {type(self.prefetch_timeout).__name__}")
        if not isinstance(self.l3_writer, bool):
            raise ConfigError(f"l3_writer must be a bool, got {self.l3_writer!r}")

    @property
    def l3_on_seal(self) -> bool:
        """Write-through policies copy a page down to L3 as soon as it is sealed on L2."""
        return self.write is not WritePolicy.WRITE_BACK

    def admitted_to_l3(self, hits: int) -> bool:
        return self.l3_writer and hits >= self.l3_admission_hits

    def prefetch_wait_s(self, tokens: int) -> float:
        """How long a request may wait for its prefetch (inf: until complete; 0: not at all)."""
        if self.prefetch is PrefetchPolicy.WAIT_COMPLETE:
            return math.inf
        if self.prefetch is PrefetchPolicy.TIMEOUT:
            return self.prefetch_timeout.for_tokens(tokens)
        return 0.0

    def lookup_wait(self, tokens: int) -> float:
        """How long a lookup waits for L3's answer about ``tokens`` (inf: until it comes)."""
        if self.prefetch is PrefetchPolicy.WAIT_COMPLETE:
            return math.inf
        if self.prefetch is PrefetchPolicy.TIMEOUT:
            return max(self.lookup_wait_s, self.prefetch_timeout.for_tokens(tokens))
        return self.lookup_wait_s


__all__ = ["Policies", "PrefetchPolicy", "PrefetchTimeout", "WritePolicy"]
