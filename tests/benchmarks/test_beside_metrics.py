"""The beside-compute group's arithmetic (benchmarks/transfer_gpu.py), on hand-made timelines: the
numbers the transfer targets name (``hidden_fraction``, ``compute_slowdown``) and where the added time went.
The group itself needs a GPU; this is the part that decides met or not met."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import transfer_gpu as tg


def test_a_model_that_never_waits_hides_the_whole_load_but_its_start():
    # Alone: 4 matmuls of 10 ms back to back from t=1. Beside a 30 ms load: layer 0 lands at 3 ms,
    # then the matmuls run back to back (each 10 ms, unslowed).
    compute = tg.compute_timeline([1, 11, 21, 31], [11, 21, 31, 41])
    both = dict(tg.compute_timeline([3, 13, 23, 33], [13, 23, 33, 43]), load_ms=30.0)
    row = tg.beside_metrics(30.0, compute, both)
    assert row["both_ms"] == 43 and row["compute_ms"] == 41
    assert row["hidden_fraction"] == pytest.approx((30 + 41 - 43) / 30)
    assert row["compute_slowdown"] == pytest.approx(1.0)
    assert row["start_delay_ms"] == 2 and row["stall_ms"] == 0 and row["late_layers"] == 0


def test_waits_between_layers_and_slower_matmuls_show_in_their_own_fields():
    compute = tg.compute_timeline([0, 10, 20], [10, 20, 30])
    # Layer 1 lands late (a 5 ms gap), and each matmul takes 11 ms beside the load's kernels.
    both = dict(tg.compute_timeline([0, 16, 27], [11, 27, 38]), load_ms=20.0)
    row = tg.beside_metrics(20.0, compute, both)
    assert row["stall_ms"] == 5 and row["late_layers"] == 1
    assert row["busy_extra_ms"] == pytest.approx(3.0)
    assert row["compute_slowdown"] == pytest.approx(33 / 30)
    assert row["hidden_fraction"] == pytest.approx((20 + 30 - 38) / 20)


def test_a_load_that_ends_after_the_compute_sets_both_ms():
    compute = tg.compute_timeline([0], [5])
    both = dict(tg.compute_timeline([0], [5]), load_ms=40.0)
    row = tg.beside_metrics(40.0, compute, both)
    assert row["both_ms"] == 40 and row["hidden_fraction"] == pytest.approx(5 / 40)
    # Gaps of 20 us or less are back-to-back matmuls, not waits.
    assert tg.compute_timeline([0, 1.01], [1, 2])["late_layers"] == 0


def test_rescaled_rows_scale_by_the_ratio_in_multiples_of_128_within_the_cap():
    assert tg.rescaled_rows(12800, 40.0, 50.0, 32768) == 10240
    assert tg.rescaled_rows(12800, 50.0, 40.0, 32768) == 16000
    assert tg.rescaled_rows(30000, 60.0, 30.0, 32768) == 32768  # capped
    assert tg.rescaled_rows(256, 1.0, 100.0, 32768) == 128  # at least one tile
    assert tg.rescaled_rows(1000, 1.0, 1.0, 32768) % 128 == 0


def test_calibration_corrects_a_guess_that_overshoots_until_within_tolerance():
    # A compute whose time per row is 1.2x what the single-matmul guess assumed, plus a fixed 1 ms.
    tries = []

    def measure(m):
        tries.append(m)
        return {"compute_end": 1.0 + m * 40.0 / 10000 * 1.2}

    m, compute = tg.calibrated_rows(10000, 40.0, measure, 32768)
    assert abs(compute["compute_end"] / 40.0 - 1) <= tg.CALIBRATION_TOLERANCE
    assert m < 10000 and len(tries) > 1 and tries[0] == 10000
    # Already within tolerance: one measurement, rows unchanged.
    tries.clear()
    m, compute = tg.calibrated_rows(8192, 1.0 + 8192 * 40.0 / 10000 * 1.2, measure, 32768)
    assert m == 8192 and tries == [8192]


def test_calibration_at_the_cap_returns_the_closest_try():
    def measure(m):
        return {"compute_end": m / 1000.0}  # 32.768 ms at the cap, 40 asked

    m, compute = tg.calibrated_rows(20000, 40.0, measure, 32768)
    assert m == 32768 and compute["compute_end"] == 32.768


def test_median_rows_take_lists_element_by_element():
    rows = [{"a": 1.0, "gaps": [0.0, 5.0]}, {"a": 3.0, "gaps": [1.0, 1.0]}, {"a": 2.0, "gaps": [9.0, 2.0]}]
    assert tg.median_rows(rows) == {"a": 2.0, "gaps": [1.0, 2.0]}


def test_late_layers_at_names_the_layers_the_model_waited_on():
    # Layer 1 started right after layer 0 ended, layer 2 waited 0.5 ms, layer 3 waited 10 us.
    timeline = tg.compute_timeline([0, 1.0, 2.5, 3.51], [1.0, 2.0, 3.5, 4.5])
    assert tg.late_layers_at(timeline["gaps"]) == {2: 0.5}
    assert timeline["late_layers"] == 1
