"""Completions: the one thing a free waits on before a slot or page can be reused.

A completion is anything with ``done() -> bool``: a ``concurrent.futures.Future``, an
``asyncio.Future``, or a CUDA event wrapped by ``as_completion`` (events answer ``query()``).
``None`` means "already complete" (CPU copies finish before the call returns).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..errors import PoolError


@runtime_checkable
class Completion(Protocol):
    def done(self) -> bool:
        """True once everything that touches the resource has finished."""
        ...


class NotACompletionError(PoolError, TypeError):
    """What was passed as a completion has neither ``done()`` nor ``query()``."""


class _Done:
    __slots__ = ()

    def done(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "DONE"


DONE: Completion = _Done()


class EventCompletion:
    """A CUDA event (or anything with ``query()``) as a completion; never synchronises."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def done(self) -> bool:
        return bool(self.event.query())


class AllOf:
    """Complete when every part is complete."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Completion]) -> None:
        self.parts = parts

    def done(self) -> bool:
        # Drop finished parts so repeated polls get cheaper.
        self.parts = [p for p in self.parts if not p.done()]
        return not self.parts


def as_completion(obj: Any) -> Completion:
    """Adapt ``None``, a future (``done()``) or a CUDA event (``query()``) to a Completion."""
    if obj is None:
        return DONE
    if callable(getattr(obj, "done", None)):
        return obj
    if callable(getattr(obj, "query", None)):
        return EventCompletion(obj)
    # The library's error (a PoolError: what frees a slot or page waits on it), also a TypeError
    # as before; raised before the caller changes anything, so a bad one frees nothing.
    raise NotACompletionError(f"a completion needs done() or query() (a future, a CUDA event, a transfer handle or None); "
                              f"got {type(obj).__name__}")
