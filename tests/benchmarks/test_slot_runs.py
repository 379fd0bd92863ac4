"""The slot-run benchmark's measure (benchmarks/slot_runs.py) on CPU: the mean run it records is
the one ``auto`` decides by, each transfer lands in the class of its mean run, and the engine is
its own again after the recording."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import slot_runs

from tiered_kv.transfers.engine import TransferEngine
from tiered_kv.transfers.policy import STAGED_MIN_MEAN_RUN, is_scattered

from ..kernels.pools import make_device_pool, make_host_pool, small_specs


@pytest.mark.parametrize("slots, want", [([1, 2, 3, 7, 8], 2.5), ([9, 3, 4, 5, 1], 5 / 3), (list(range(40, 72)), 32.0)])
def test_mean_run_is_autos_measure(slots, want):
    assert slot_runs.mean_run(slots) == pytest.approx(want)
    assert is_scattered(torch.tensor(slots)) == (slot_runs.mean_run(slots) < STAGED_MIN_MEAN_RUN)


def test_shares_put_each_transfer_in_the_class_of_its_mean_run():
    calls = [("load", 10, 1.0, 0.0), ("load", 30, 16.0, 0.1), ("load", 60, 512.0, 0.2)]
    got = slot_runs.shares(calls)
    assert got["scattered (< 2)"] == 0.1 and got["8-32 (runs of 16)"] == 0.3 and got[">= 128 (runs)"] == 0.6
    assert sum(got.values()) == pytest.approx(1.0)


def test_recorder_notes_every_transfer_and_puts_the_engine_back():
    spec = small_specs()["nsa"]
    device, host = make_device_pool(spec, 20), make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host, path="torch")
    original = TransferEngine.load, TransferEngine.backup
    with slot_runs.Recorder() as recorder:
        engine.backup([1, 2, 3], [4, 5, 9])
        engine.load([4, 5, 9], [6, 7, 8])
        engine.load([], [])  # nothing moved: not a transfer
    assert [(op, pages, run) for op, pages, run, _ in recorder.calls] == [("backup", 3, 1.5), ("load", 3, 1.5)]
    assert (TransferEngine.load, TransferEngine.backup) == original
    view = device.pool.chunk_view(0, 0)
    assert torch.equal(view[6], view[1]) and torch.equal(view[8], view[3])  # the calls still copied
