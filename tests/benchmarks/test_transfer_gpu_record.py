"""The recorded GPU benchmark (``docs/benchmarks/transfer_gpu.json``, written by
``benchmarks/transfer_gpu.py`` on the H200) holds what a run of record must: every op with slots
in runs and scattered, load + backup at once with both, the beside-compute group, and the ceilings
of the same run; and its derived numbers agree with the measured ones they come from. A run that
stopped early or a writer that dropped a group or a key fails here."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

RECORD = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "transfer_gpu.json"
LAYOUTS = ("page_first", "layer_first")
SLOTS = ("runs", "scattered")


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def rows(record: dict, group: str) -> list[dict]:
    return [row for row in record["results"] if row.get("group") == group]


def test_the_run_completed_with_its_own_ceilings(record):
    assert record["complete"] is True
    ceilings = {row["op"]: row["gbps"] for row in rows(record, "ceiling")}
    assert {"h2d", "d2h", "both"} <= ceilings.keys()
    assert record["ceiling_gbps"]["load61"] == pytest.approx(ceilings["h2d"])
    assert record["ceiling_gbps"]["backup"] == pytest.approx(ceilings["d2h"])


@pytest.mark.parametrize("op", ["backup", "load61", "load1"])
def test_every_op_of_auto_has_slots_in_runs_and_scattered(record, op):
    found = {(row["layout"], row["slots"]): row for row in rows(record, "paths")
             if row["op"] == op and row["path"] == "auto"}
    assert set(found) == {(layout, slots) for layout in LAYOUTS for slots in SLOTS}
    for row in found.values():
        # The rate is the bytes over the median time, and the caller's issue time is recorded.
        assert row["gbps"] == pytest.approx(row["bytes"] / row["ms"] / 1e6, rel=1e-9)
        assert row["issue_ms"] > 0 and math.isfinite(row["cpu_ms"])


def test_load_and_backup_at_once_with_both_kinds_of_slots(record):
    found = {(row["layout"], row["slots"]) for row in rows(record, "both")}
    assert found == {(layout, slots) for layout in LAYOUTS for slots in SLOTS}
    for row in rows(record, "both"):
        assert row["vs_one_direction"] > 0


def test_beside_compute_rows_hold_the_issue_keys_and_their_arithmetic(record):
    beside = rows(record, "beside_compute")
    auto = {(row["layout"], row["slots"], row["factor"]) for row in beside if row["path"] == "auto"}
    assert auto == {(layout, slots, factor) for layout in LAYOUTS for slots in SLOTS for factor in (0.5, 1.25)}
    for row in beside:
        for key in ("load_ms", "compute_ms", "both_ms", "hidden_fraction", "compute_slowdown"):
            assert math.isfinite(row[key]), (row["name"], key)
        assert row["hidden_fraction"] == pytest.approx(
            (row["load_ms"] + row["compute_ms"] - row["both_ms"]) / row["load_ms"], rel=1e-9, abs=1e-12)
        assert row["compute_per_load"] == pytest.approx(row["compute_ms"] / row["load_ms"], rel=1e-9)
        # Both at once take at least as long as the longer of the two alone, within the noise of a rep.
        assert row["both_ms"] >= 0.9 * max(row["compute_ms"], row["load_ms"])


@pytest.mark.parametrize("group", ["from_call", "from_call_busy"])
def test_auto_backup_and_load_are_timed_from_the_call_too(record, group):
    """The targets' ops of ``auto`` timed from the call (no device sleep ahead of the issue), on an
    idle GPU and on a busy one, for both layouts and kinds of slots, with the same arithmetic; and
    timed so, no op beats its own idle-device time by more than the run's noise."""
    found = {(row["layout"], row["slots"], row["op"]): row for row in rows(record, group) if row["path"] == "auto"}
    assert set(found) == {(layout, slots, op) for layout in LAYOUTS for slots in SLOTS for op in ("backup", "load61")}
    ahead = {(row["layout"], row["slots"], row["op"]): row for row in rows(record, "paths") if row["path"] == "auto"}
    for key, row in found.items():
        assert row["gbps"] == pytest.approx(row["bytes"] / row["ms"] / 1e6, rel=1e-9)
        assert row["frac_of_ceiling"] == pytest.approx(row["gbps"] / record["ceiling_gbps"][row["op"]], rel=1e-9)
        assert row["gbps"] <= ahead[key]["gbps"] * 1.02
