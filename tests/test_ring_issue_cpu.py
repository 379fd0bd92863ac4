"""benchmarks/ring_issue_cpu.py: it times loads with the copies left out, and puts every stubbed
call back afterwards (so a load after it moves bytes again)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import ring_issue_cpu as ric  # noqa: E402

from tiered_kv import nsa_spec  # noqa: E402
from tiered_kv.kernels import staged_copy, uva_copy  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402

from .kernels.pools import make_device_pool, make_host_pool  # noqa: E402


def _originals():
    return (staged_copy.launch_uva, uva_copy.launch_uva, staged_copy.StagedCopier._engine_copies, TransferEngine._uva)


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_measure_times_loads_and_restores_every_stub(layout):
    before = _originals()
    row = ric.measure(layout, loads=2, pages=6, layers=3, rounds=2)
    assert _originals() == before
    assert row["layout"] == layout and len(row["ms_rounds"]) == 2 and row["ms_per_load"] > 0


def test_inside_the_context_a_load_moves_no_bytes_and_after_it_does():
    spec = nsa_spec(num_layers=3, page_size=4)
    device, host = make_device_pool(spec, 9, "cpu"), make_host_pool(spec, 8, "layer_first")
    engine = TransferEngine(device.pool, host, path="mixed")
    slots, pages = torch.arange(8), torch.arange(1, 9)

    def landed() -> bool:
        return all(torch.equal(device.pool.chunk_view(ci, layer)[pages], host.chunk_view(ci, layer)[slots])
                   for ci in range(len(spec.components)) for layer in range(spec.num_layers))

    for root in device.roots:
        root.zero_()
    with ric.copies_left_out():
        engine.load(slots, pages).synchronize()
    assert not landed()
    engine.load(slots, pages).synchronize()
    assert landed()


def test_bad_arguments_are_refused(monkeypatch, capsys):
    from .probe_cli import assert_refused

    assert_refused(monkeypatch, capsys, ric.main, "ring_issue_cpu.py", ["--loads", "0"])
