"""Making a stream current around a few launches, for less of the issuing thread than ``torch.cuda.stream``.

``torch.cuda.stream(s)`` looks the current device up through ``torch.cuda.is_available`` in its
``__init__`` and again in its ``__enter__``: about 45 us per use on the H200's host under the
profiler, and a load's caller enters several of them before layer 0 is launched. ``on_stream``
asks for the current device by index and sets the stream directly. A stream on another device
than the current one goes through ``torch.cuda.stream`` (which also switches the device for the
block).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch


class _StreamSwitch:
    """``stream`` current on its device for the block; the device's previous stream after it."""

    __slots__ = ("stream", "previous", "fallback")

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream
        self.previous = None
        self.fallback = None

    def __enter__(self) -> torch.cuda.Stream:
        stream = self.stream
        index = stream.device_index
        if torch.cuda.current_device() != index:
            self.fallback = torch.cuda.stream(stream)
            self.fallback.__enter__()
            return stream
        self.previous = torch.cuda.current_stream(index)
        torch.cuda.set_stream(stream)
        return stream

    def __exit__(self, *exc) -> bool:
        if self.fallback is not None:
            fallback, self.fallback = self.fallback, None
            fallback.__exit__(*exc)
            return False
        previous, self.previous = self.previous, None
        torch.cuda.set_stream(previous)
        return False


def on_stream(stream: torch.cuda.Stream | None):
    """A context in which ``stream`` is current (nothing for None: CPU pools have no streams)."""
    return nullcontext() if stream is None else _StreamSwitch(stream)


__all__ = ["on_stream"]
