"""The backup-timeline probe (benchmarks/backup_timeline.py) on CPU: its steps name attributes that
exist, its first-unit marks leave a staged backup's bytes and the ring's methods as they were, and
bad arguments are refused before any device work."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import backup_timeline  # noqa: E402
import issue_timeline  # noqa: E402

from tiered_kv import nsa_spec  # noqa: E402
from tiered_kv.kernels import staged_copy  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402

from .kernels.pools import make_device_pool, make_host_pool  # noqa: E402
from .probe_cli import assert_refused  # noqa: E402


def _current(owner, name):
    return owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)


def test_steps_and_marks_wrap_a_staged_backup_and_undo_restores_them():
    """Wrapped by the step timers and the first-unit marks, a CPU staged backup writes the same
    bytes, counts its caller-side steps once and its ring units at least once; CPU copies have no
    streams, so no mark is taken; afterwards every original method is back."""
    originals = [(owner, name, _current(owner, name)) for owner, name, _ in backup_timeline.STEPS]
    ring = {name: staged_copy.StagedCopier.__dict__[name] for name in ("_kernel", "_engine_copies")}
    spec = nsa_spec(num_layers=3, page_size=2)
    device, host = make_device_pool(spec, 12), make_host_pool(spec, 10, "page_first")
    timers, marks = issue_timeline.Timers(), backup_timeline.FirstUnit()
    for owner, name, label in backup_timeline.STEPS:
        timers.wrap(owner, name, label)
    marks.install()
    try:
        timers.on = True
        marks.reset(0.0)
        pages, slots = torch.tensor([3, 9, 1]), torch.tensor([7, 2, 5])
        TransferEngine(device.pool, host, path="staged").backup(pages, slots).synchronize()
        timers.on = False
    finally:
        marks.uninstall()
        timers.undo()
    counted = {r["step"]: r["calls_per_rep"] for r in timers.rows(reps=1) if r["thread"] == threading.current_thread().name}
    assert counted["engine.backup (whole call)"] == 1 and counted["engine: validate (ids, pools)"] == 1
    assert counted["staged._run (whole ring call)"] == 1 and counted["staged._kernel (gather launch)"] >= 1
    assert counted["staged._engine_copies (CE copies)"] == counted["staged._kernel (gather launch)"]
    assert (marks.launch_ms, marks.copy_ms, marks.gathered, marks.copied) == (None, None, None, None)
    for owner, name, original in originals:
        assert _current(owner, name) is original, name
    for name, original in ring.items():
        assert staged_copy.StagedCopier.__dict__[name] is original, name
    for layer in range(spec.num_layers):
        for ci in range(len(spec.components)):
            assert torch.equal(host.chunk_view(ci, layer)[slots], device.pool.chunk_view(ci, layer)[pages])


@pytest.mark.parametrize("bad", [["--reps", "0"], ["--plan-waves", "default,-1"], ["--plan-waves", "two"]])
def test_bad_arguments_exit_2_before_any_device_work(monkeypatch, capsys, bad):
    assert_refused(monkeypatch, capsys, backup_timeline.main, "backup_timeline.py", bad)


def test_plan_waves_name_the_options_of_each_case():
    assert backup_timeline.plan_wave("default") == backup_timeline.TransferOptions()
    assert backup_timeline.plan_wave(" 4").backup_plan_wave == 4
    assert backup_timeline.backup_plan_wave(backup_timeline.plan_wave("0")) is None
