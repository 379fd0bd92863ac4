"""The stream-alias probe (benchmarks/stream_alias_probe.py) and the benchmark's side stream
(``transfer_gpu.side_stream``) on CPU: every stream an engine holds is found (its own attributes,
lists of them, its issue threads'), new streams that are engine streams are named, the side stream
of a busy-GPU timing is none of them, and bad arguments are refused before any device work."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import stream_alias_probe as probe  # noqa: E402
import transfer_gpu as tg  # noqa: E402

from .probe_cli import assert_refused  # noqa: E402


class Stream:
    """A stand-in for ``torch.cuda.Stream``: only its handle."""

    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


class Holder:
    def __init__(self, streams) -> None:
        self.streams = streams


class Engine:
    def __init__(self) -> None:
        self.backup_stream, self.load_stream = Stream(11), Stream(12)
        self._head_streams = [Stream(13), Stream(14)]
        self._half_streams = (Stream(15), Stream(11))  # two names for one handle
        self._issuer = Holder([Stream(16)])
        self._backup_issuer = None
        self.not_a_stream = 17


def test_engine_streams_finds_attributes_lists_and_issue_threads():
    found = tg.engine_stream_handles(Engine(), stream_type=Stream)
    assert found == {"backup_stream": 11, "load_stream": 12, "_head_streams[0]": 13, "_head_streams[1]": 14,
                     "_half_streams[0]": 15, "_half_streams[1]": 11, "_issuer.streams[0]": 16}


def test_aliases_name_each_new_stream_that_is_an_engine_stream():
    handles = tg.engine_stream_handles(Engine(), stream_type=Stream)
    assert probe.aliases(handles, [99, 11, 16, 98]) == {1: ["backup_stream", "_half_streams[1]"],
                                                       2: ["_issuer.streams[0]"]}
    assert probe.aliases(handles, [1, 2, 3]) == {}


def test_the_side_stream_of_a_busy_gpu_timing_is_none_of_the_engines():
    """torch's pool hands streams out round-robin: the side stream skips those the engine holds,
    and says so when every new stream is one of them."""
    handles = iter([11, 16, 12, 40, 11])
    stream = tg.side_stream(tg.engine_stream_handles(Engine(), stream_type=Stream).values(),
                            make=lambda: Stream(next(handles)))
    assert stream.cuda_stream == 40
    with pytest.raises(RuntimeError, match="no new stream in 3"):
        tg.side_stream([11], tries=3, make=lambda: Stream(11))
    assert tg.side_stream([], make=lambda: Stream(11)).cuda_stream == 11


@pytest.mark.parametrize("bad", [["--streams", "0"], ["--reps", "0"], ["--streams", "x"], ["--ab-reps", "-1"]])
def test_bad_arguments_exit_2_before_any_device_work(monkeypatch, capsys, bad):
    assert_refused(monkeypatch, capsys, probe.main, "stream_alias_probe.py", bad)


def test_without_cuda_it_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(probe.torch.cuda, "is_available", lambda: False)
    assert_refused(monkeypatch, capsys, probe.main, "stream_alias_probe.py", [], "needs a CUDA device")


def test_the_from_call_ab_times_both_engines_per_op_and_layout_and_copies_the_bytes(monkeypatch):
    """On CPU pools (the engine's CPU path; no device to synchronise): every (op, layout, streams)
    row has its reps, and the last backup and load moved the right bytes."""
    import torch

    from tiered_kv import nsa_spec

    from .kernels.pools import make_device_pool, make_host_pool, random_ids

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    spec = nsa_spec(num_layers=3, page_size=4)
    device = make_device_pool(spec, 24, "cpu")
    hosts = {layout: make_host_pool(spec, 20, layout) for layout in ("page_first", "layer_first")}
    pages, slots = random_ids(6, 0, 23) + 1, random_ids(6, 1, 20)  # page 0 is the engine's reserved page
    rows = probe.from_call_ab(device.pool, hosts, pages, slots, reps=3)
    assert sorted(rows) == sorted(f"{op} {layout} scattered {name}" for op in ("backup", "load61")
                                  for layout in hosts for name in ("owned", "pool"))
    assert all(len(row["each"]) == 3 and row["ms"] > 0 and row["gbps"] > 0 for row in rows.values())
    for host in hosts.values():  # the load brought back what the backup wrote: slots == pages
        for ci in range(len(spec.components)):
            for layer in range(spec.num_layers):
                assert torch.equal(host.chunk_view(ci, layer)[slots], device.pool.chunk_view(ci, layer)[pages])
