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
    import pytest

    for argv in (["--set", "nosuchset"], ["--set", "twentyfourth", "--lead-blocks", "1,3"], ["--reps", "0"]):
        monkeypatch.setattr(sys, "argv", ["issue_timeline.py", *argv])
        with pytest.raises(SystemExit) as exit_info:
            issue_timeline.main()
        assert exit_info.value.code == 2
        assert "error:" in capsys.readouterr().err
