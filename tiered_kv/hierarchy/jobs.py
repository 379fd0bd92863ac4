"""Plain-data plans between the two halves: a ``Job`` goes to the worker side, a ``JobResult`` comes back.

A job names what moves by plain ids only (L1 page ids, L2 slot ids, L3 keys) and its kind, whose
``(source, destination)`` tiers pick the worker side's handler:

    STORE     L1 -> L2    back engine pages up into slots (sealed once the bytes landed)
    LOAD      L2 -> L1    read slots into engine pages
    PREFETCH  L3 -> L2    read keys into slots
    PUT       L2 -> L3    write sealed slots under their keys
    EXISTS    L3 -> none  the leading run of keys L3 holds (no bytes move)
    DELETE    none -> L3  drop keys from L3

Both classes pickle and cross a pipe or a queue: they must never hold torch, CUDA, asyncio or any
other object of one process (a handle, a future, an event). Nothing here imports beyond the
standard library.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import ConfigError


class Tier(enum.Enum):
    L1 = "l1"
    L2 = "l2"
    L3 = "l3"


class JobKind(enum.Enum):
    """A kind of job and its ``(source, destination)`` tiers (None: no tier, a key-only call)."""

    STORE = ("store", Tier.L1, Tier.L2)
    LOAD = ("load", Tier.L2, Tier.L1)
    PREFETCH = ("prefetch", Tier.L3, Tier.L2)
    PUT = ("put", Tier.L2, Tier.L3)
    EXISTS = ("exists", Tier.L3, None)
    DELETE = ("delete", None, Tier.L3)

    @property
    def source(self) -> Tier | None:
        return self.value[1]

    @property
    def destination(self) -> Tier | None:
        return self.value[2]

    @property
    def route(self) -> tuple[Tier | None, Tier | None]:
        """The worker side's dispatch key."""
        return self.value[1], self.value[2]


#: What each kind's ids must hold: (keys, slots, pages), True where the kind needs them.
_NEEDS = {
    JobKind.STORE: (True, True, True),
    JobKind.LOAD: (True, True, True),
    JobKind.PREFETCH: (True, True, False),
    JobKind.PUT: (True, True, False),
    JobKind.EXISTS: (True, False, False),
    JobKind.DELETE: (True, False, False),
}


@dataclass(frozen=True)
class Job:
    """One move (or key-only question) for the worker side; ``keys[i]`` goes with ``slots[i]`` and
    ``pages[i]`` where the kind has them."""

    job_id: int
    kind: JobKind
    keys: tuple[str, ...] = ()
    slots: tuple[int, ...] = ()
    pages: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.job_id, bool) or not isinstance(self.job_id, int):
            raise ConfigError(f"Job.job_id must be an int, got {self.job_id!r}")
        if not isinstance(self.kind, JobKind):
            raise ConfigError(f"Job.kind must be a JobKind, got {self.kind!r}")
        object.__setattr__(self, "keys", tuple(str(k) for k in self.keys))
        object.__setattr__(self, "slots", tuple(int(s) for s in self.slots))
        object.__setattr__(self, "pages", tuple(int(p) for p in self.pages))
        _, needs_slots, needs_pages = _NEEDS[self.kind]
        for name, needed in (("slots", needs_slots), ("pages", needs_pages)):
            ids = getattr(self, name)
            if needed and len(ids) != len(self.keys):
                raise ConfigError(f"{self.kind.name} job {self.job_id}: {len(self.keys)} keys but {len(ids)} {name}")
            if not needed and ids:
                raise ConfigError(f"{self.kind.name} job {self.job_id} takes no {name}, got {len(ids)}")


@dataclass(frozen=True)
class JobResult:
    """What became of a job.

    ``ok[i]``: whether ``keys[i]`` moved (for EXISTS: the leading ``count`` are True).
    ``count``: EXISTS's leading run; for the others the pages that moved.
    ``heard``: the answer came from the tier itself (False: refused, degraded, cancelled, lost:
    no news about what L3 holds).
    ``cancelled``: dropped before it started; nothing touched its slots.
    ``lost``: the worker went away with the job unfinished; what it did to its slots is unknown.
    ``l3_degraded``: the worker side's L3 state once the job ended.
    ``error``: a failure that is no answer (a bug on the worker side), as text.
    """

    job_id: int
    kind: JobKind
    ok: tuple[bool, ...] = ()
    count: int = 0
    heard: bool = True
    cancelled: bool = False
    lost: bool = False
    l3_degraded: bool = False
    error: str | None = None

    @classmethod
    def failed(cls, job: Job, *, cancelled: bool = False, lost: bool = False, l3_degraded: bool = False,
               error: str | None = None) -> "JobResult":
        """A job that moved nothing and says nothing about what the tiers hold."""
        return cls(job.job_id, job.kind, (False,) * len(job.keys), 0, False, cancelled, lost, l3_degraded, error)


__all__ = ["Job", "JobKind", "JobResult", "Tier"]
