"""The short-runs probe's rules (benchmarks/short_runs_probe.py) on CPU: each one changes the
staging ring's batch decision the way it says, and puts the library's back afterwards, so a probe
run on the H200 measures what it names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import short_runs_probe  # noqa: E402

from tiered_kv.kernels import StagedCopier, staged_copy  # noqa: E402
from tiered_kv.transfers.torch_path import load_pairs  # noqa: E402
from tiered_kv.transfers.engine import TransferEngine  # noqa: E402

from .kernels.pools import check_copy, make_device_pool, make_host_pool, random_ids, small_specs  # noqa: E402
from .kernels.test_staged_planning import SPEC, ring_decisions  # noqa: E402


def _decisions(layout: str, monkeypatch) -> set[bool]:
    """The ring's batch decision for every unit of a 4-layer load from 16 runs of 4 slots."""
    monkeypatch.setattr(staged_copy, "_batch_available", lambda: True)
    decided = ring_decisions(SPEC, layout, range(SPEC.num_layers))
    assert all(copies >= staged_copy.BATCH_MIN_COPIES for copies, _ in decided)
    return {batched for _, batched in decided}


def _library_state() -> tuple:
    """Everything a rule swaps: the count, both limits of the batch and the decision itself."""
    return (staged_copy._batch_rows, staged_copy.BATCH_MAX_MEAN_ROWS, staged_copy.BATCH_MIN_COPIES,
            staged_copy.BATCH_MIN_COPIES_TO_HOST, StagedCopier._batched)


@pytest.mark.parametrize("name, layer_first, page_first", [
    ("now", {True}, {True}),        # the library's (rows 64): pitched short runs batch row by row too
    ("rows 2", {True}, {False}),    # dense runs batch; pitched runs of 4 rows stay 2-D calls
    ("before", {False}, {False}),   # dense runs counted by their rows: 2-D calls
    ("rows 16", {True}, {True}),
    ("rows 64", {True}, {True}),
    ("min 4", {True}, {True}),
])
def test_each_rule_makes_the_decision_it_names(name, layer_first, page_first, monkeypatch):
    library = _library_state()
    with short_runs_probe.rule(name) as decisions:
        got = {"layer_first": _decisions("layer_first", monkeypatch), "page_first": _decisions("page_first", monkeypatch)}
    assert got == {"layer_first": layer_first, "page_first": page_first}
    # Every decision counted, on the branch it took (one unit per layout here).
    assert decisions == {"batch": (True in layer_first) + (True in page_first),
                         "2-D calls": (False in layer_first) + (False in page_first)}
    assert _library_state() == library


@pytest.mark.parametrize("name", ["before", "min 4"])
def test_a_rule_is_undone_when_the_call_inside_raises(name):
    library = _library_state()
    with pytest.raises(RuntimeError), short_runs_probe.rule(name):
        assert _library_state() != library
        raise RuntimeError("a failed call")
    assert _library_state() == library


def test_the_rules_pin_every_limit_but_now():
    """Each rule other than ``now`` names all four values it was measured with, so a later change
    of the library's limits does not change what a rule measures."""
    for name, values in short_runs_probe.RULES.items():
        if name != "now":
            assert all(v is not None for v in values[1:]), name


def test_runs_of_64_are_whole_blocks_of_adjacent_slots():
    slots = short_runs_probe.runs_of(64, 512, 2048)
    assert slots.numel() == 512 and slots.unique().numel() == 512 and int(slots.max()) < 2048
    blocks = slots.view(8, 64)
    assert bool((blocks[:, 1:] - blocks[:, :-1] == 1).all()) and bool((blocks[:, 0] % 64 == 0).all())


@pytest.mark.parametrize("run", [4, 16])
@pytest.mark.parametrize("entry", short_runs_probe.PAGE_FIRST_CANDIDATES, ids=lambda e: e[0])
def test_page_first_candidates_copy_every_byte(entry, run):
    name, options, rule_name = entry
    spec = small_specs()["nsa"]
    device, host = make_device_pool(spec, 40), make_host_pool(spec, 64, "page_first")
    engine = TransferEngine(device.pool, host, path="mixed")
    slots = short_runs_probe.runs_of(run, 32, 64)
    pages = random_ids(32, 1, 40)
    pairs = [pair for layer in range(spec.num_layers) for pair in load_pairs(host, device.pool, layer)]
    with short_runs_probe.rule(rule_name):
        check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, options=options))
    # Every candidate is auto's own split (no options) or a split in blocks of 8 layers.
    assert options is None or options.load_split.layers_per_copy == 8
