"""The issue-timeline probe's step timers (benchmarks/issue_timeline.py) on CPU: a wrapped step
is timed per thread only while the timers are on, traced only while tracing, keeps its result
and its kind (plain or static method), and ``undo`` puts the original back."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import issue_timeline  # noqa: E402


class Steps:
    def work(self, ms: float) -> str:
        time.sleep(ms / 1e3)
        return "done"

    @staticmethod
    def pure(x: int) -> int:
        return x + 1


def test_timers_count_each_thread_only_while_on_and_undo_restores():
    original_work, original_pure = Steps.__dict__["work"], Steps.__dict__["pure"]
    timers = issue_timeline.Timers()
    timers.wrap(Steps, "work", "work")
    timers.wrap(Steps, "pure", "pure")
    steps = Steps()
    assert steps.work(1) == "done" and Steps.pure(1) == 2 and not timers.wall  # off: nothing counted
    timers.on, timers.tracing = True, True
    assert steps.work(5) == "done"
    worker = threading.Thread(target=steps.work, args=(5,), name="other")
    worker.start()
    worker.join()
    assert Steps.pure(2) == 3
    timers.on = False
    rows = {(r["step"], r["thread"]): r for r in timers.rows(reps=1)}
    assert set(rows) == {("work", "MainThread"), ("work", "other"), ("pure", "MainThread")}
    assert rows[("work", "other")]["calls_per_rep"] == 1 and rows[("work", "other")]["wall_ms_per_rep"] >= 4.5
    # Sleeping costs wall time, not CPU.
    assert rows[("work", "MainThread")]["cpu_ms_per_rep"] < rows[("work", "MainThread")]["wall_ms_per_rep"]
    assert [(label, thread) for label, thread, _, _ in timers.trace] == [("work", "MainThread"), ("work", "other"),
                                                                         ("pure", "MainThread")]
    assert all(end >= start for _, _, start, end in timers.trace)
    timers.undo()
    assert Steps.__dict__["work"] is original_work and Steps.__dict__["pure"] is original_pure


def test_bad_arguments_exit_2_before_any_device_work(monkeypatch, capsys):
    """An unknown candidate set, ``--set`` with ``--lead-blocks`` (both swap the policy tables) and
    ``--reps 0`` are refused with one line, exit 2, before any pool is made (no CUDA here)."""
    from .probe_cli import assert_refused

    for argv in (["--set", "nosuchset"], ["--set", "twentyfourth", "--lead-blocks", "1,3"], ["--reps", "0"]):
        assert_refused(monkeypatch, capsys, issue_timeline.main, "issue_timeline.py", argv)


def test_every_step_wraps_the_real_engine_and_undo_restores_it():
    """Each entry of ``STEPS`` names an attribute that exists, so a rename in the engine fails here
    and not on the H200. Wrapped, a CPU load copies the same bytes and counts its caller-side
    steps once; ``undo`` puts every original back."""
    import torch

    from tiered_kv import nsa_spec
    from tiered_kv.transfers.engine import TransferEngine

    from .kernels.pools import make_device_pool, make_host_pool

    def current(owner, name):
        return owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    originals = [(owner, name, current(owner, name)) for owner, name, _ in issue_timeline.STEPS]
    spec = nsa_spec(num_layers=3, page_size=1)
    device, host = make_device_pool(spec, 12), make_host_pool(spec, 10, "page_first")
    timers = issue_timeline.Timers()
    for owner, name, label in issue_timeline.STEPS:
        timers.wrap(owner, name, label)
    try:
        timers.on = True
        slots, pages = torch.tensor([7, 2, 5]), torch.tensor([3, 9, 1])
        TransferEngine(device.pool, host, path="torch").load(slots, pages).synchronize()
        timers.on = False
    finally:
        timers.undo()
    counted = {r["step"]: r["calls_per_rep"] for r in timers.rows(reps=1) if r["thread"] == threading.current_thread().name}
    assert counted["engine.load (whole call)"] == 1 and counted["engine: validate (ids, pools)"] == 1
    assert counted["engine: path choice"] == 1 and counted["engine: _Load objects"] >= 1
    for owner, name, original in originals:
        assert current(owner, name) is original, name
    for layer in range(spec.num_layers):
        for ci in range(len(spec.components)):
            assert torch.equal(device.pool.chunk_view(ci, layer)[pages], host.chunk_view(ci, layer)[slots])


def test_lead_blocks_are_set_for_every_case_and_1_gives_the_policy_back():
    """A case with ``--lead-blocks`` 1 after one with 3 measures the policy's own splits (the
    tables are swapped per case, not only for leads other than 1)."""
    import tiered_kv.transfers.policy as tp

    policy = (tp.SCATTERED_LOADS, tp.MIXED_LOADS)
    try:
        issue_timeline.use_lead_blocks(3)
        assert all(s.lead_blocks == 3 for table in (tp.SCATTERED_LOADS, tp.MIXED_LOADS) for s in table.values())
        assert tp.SCATTERED_LOADS.keys() == policy[0].keys() and tp.MIXED_LOADS.keys() == policy[1].keys()
        issue_timeline.use_lead_blocks(1)
        assert tp.SCATTERED_LOADS == policy[0] and tp.MIXED_LOADS == policy[1]
        assert [s.lead_blocks for s in tp.SCATTERED_LOADS.values()] == [s.lead_blocks for s in policy[0].values()]
    finally:
        tp.SCATTERED_LOADS, tp.MIXED_LOADS = policy
