"""Stand-ins for CUDA streams and events, for CPU tests of the engine's thread and event logic.

A library issue thread only runs on a GPU; with these patched over ``torch.cuda`` (``patch_cuda``)
its jobs run on a CPU machine, and each wait says which record of its event it binds to (a wait on
an event never recorded waits on nothing on a real device).
"""

from __future__ import annotations

import torch


class FakeEvent:
    """A CUDA event stand-in: the streams it was recorded on, in order."""

    def __init__(self, *args, **kwargs) -> None:
        self.records: list = []

    def record(self, stream=None) -> None:
        self.records.append(stream)

    def query(self) -> bool:
        return True


class FakeStream:
    """A CUDA stream stand-in: each wait remembers how many records of the event it binds to
    (0: a wait on an event never recorded, which waits on nothing)."""

    device_index = 0

    def __init__(self, *args, **kwargs) -> None:
        self.waited: list = []

    def wait_event(self, event) -> None:
        self.waited.append((event, len(event.records)))

    def wait_stream(self, stream) -> None:
        pass


class Nothing:
    """A context manager (``torch.cuda.device`` / ``torch.cuda.stream``) that does nothing."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def patch_cuda(monkeypatch) -> FakeStream:
    """Streams, events and the device / stream contexts of ``torch.cuda`` as the stand-ins above;
    device 0 is current, with a current stream that ``torch.cuda.set_stream`` changes (what
    ``kernels.streams.on_stream`` uses). Returns the device's default stream."""
    for name, fake in (("Stream", FakeStream), ("Event", FakeEvent), ("device", Nothing), ("stream", Nothing)):
        monkeypatch.setattr(torch.cuda, name, fake)
    default = FakeStream()
    current = [default]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: current.__setitem__(0, stream))
    return default
