"""``kernels.streams.on_stream``: the stream current for the block only, on its own device or not
(stand-in streams: the CPU machines have no CUDA)."""

from __future__ import annotations

import pytest
import torch

from tests.fake_cuda import FakeStream, patch_cuda
from tiered_kv.kernels.streams import on_stream


def test_no_stream_is_a_context_that_changes_nothing():
    with on_stream(None) as entered:
        assert entered is None


def test_the_stream_is_current_inside_and_the_previous_one_after(monkeypatch):
    default = patch_cuda(monkeypatch)
    first, second = FakeStream(), FakeStream()
    with on_stream(first) as entered:
        assert entered is first and torch.cuda.current_stream() is first
        with on_stream(second):
            assert torch.cuda.current_stream() is second
        assert torch.cuda.current_stream() is first
    assert torch.cuda.current_stream() is default


def test_the_previous_stream_comes_back_after_an_error(monkeypatch):
    default = patch_cuda(monkeypatch)
    with pytest.raises(KeyError):
        with on_stream(FakeStream()):
            raise KeyError("inside")
    assert torch.cuda.current_stream() is default


def test_a_stream_of_another_device_goes_through_torch_cuda_stream(monkeypatch):
    """torch's context also switches the device for the block; the fast path never sets it."""
    default = patch_cuda(monkeypatch)
    used = []

    class TorchContext:
        def __init__(self, stream):
            used.append(("made", stream))
            self.stream = stream

        def __enter__(self):
            used.append(("entered", self.stream))

        def __exit__(self, *exc):
            used.append(("left", self.stream))
    monkeypatch.setattr(torch.cuda, "stream", TorchContext)
    other = FakeStream()
    other.device_index = 1
    with on_stream(other):
        assert torch.cuda.current_stream() is default  # not set by the fast path
    assert used == [("made", other), ("entered", other), ("left", other)]
    mine = FakeStream()
    with on_stream(mine):
        assert torch.cuda.current_stream() is mine
    assert len(used) == 3  # a stream of the current device never goes through torch's context


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_work_inside_goes_on_the_stream_and_the_callers_stream_comes_back():
    """On a device: the stream is current inside (a copy enqueued there runs on it: the caller's
    stream, which waited for nothing, sees it only after a wait), and the caller's stream after."""
    caller = torch.cuda.Stream()
    side = torch.cuda.Stream()
    source = torch.arange(1 << 20, dtype=torch.int64, device="cuda")
    target = torch.zeros_like(source)
    torch.cuda.synchronize()
    with torch.cuda.stream(caller):
        with on_stream(side):
            assert torch.cuda.current_stream() == side
            target.copy_(source)
            done = torch.cuda.Event()
            done.record()  # on the current stream: ``side``
        assert torch.cuda.current_stream() == caller
        caller.wait_event(done)
        total = target.sum()
    torch.cuda.synchronize()
    assert done.query() and int(total) == int(source.sum())
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
