"""The serving probe's candidate sets (benchmarks/serving_probe.py) on CPU pools: every candidate's
options are valid and every load and backup candidate copies every byte, so a probe run on the
H200 does not spend device time on a candidate that is wrong before it is timed."""

from __future__ import annotations

from dataclasses import replace

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import serving_probe  # noqa: E402

from tiered_kv.transfers.engine import TransferEngine, TransferOptions  # noqa: E402
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs  # noqa: E402

from .kernels.pools import check_copy, make_device_pool, make_host_pool, random_ids, small_specs  # noqa: E402

SPEC = small_specs()["nsa"]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", serving_probe.NINTH_LOADS, ids=lambda e: e[0])
def test_ninth_load_candidates_copy_every_byte(entry, layout):
    name, path, options, kwargs = entry
    device, host = make_device_pool(SPEC, 20), make_host_pool(SPEC, 16, layout)
    engine = TransferEngine(device.pool, host, path=path, **kwargs)
    slots, pages = torch.randperm(16)[:9], random_ids(9, 1, 20)
    pairs = [pair for layer in range(SPEC.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, options=options))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", serving_probe.NINTH_BACKUPS, ids=lambda e: e[0])
def test_ninth_backup_candidates_copy_every_byte(entry, layout):
    name, path, options = entry
    device, host = make_device_pool(SPEC, 20), make_host_pool(SPEC, 16, layout)
    engine = TransferEngine(device.pool, host, path=path)
    pages, slots = random_ids(9, 1, 20), torch.randperm(16)[:9]
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: engine.backup(pages, slots, options=options))


def test_ninth_both_and_beside_entries_name_known_paths():
    from tiered_kv.transfers.policy import PATHS

    for name, load_path, _, backup_path, _ in serving_probe.NINTH_BOTH + serving_probe.THIRTYFOURTH_BOTH:
        assert load_path in PATHS and backup_path in PATHS, name
    assert {e[0] for e in serving_probe.NINTH_BESIDE} <= {e[0] for e in serving_probe.NINTH_LOADS}


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", serving_probe.TENTH_BOTH + serving_probe.THIRTYFOURTH_BOTH, ids=lambda e: e[0])
def test_tenth_both_sides_copy_every_byte(entry, layout):
    name, load_path, load_options, backup_path, backup_options = entry
    device, host = make_device_pool(SPEC, 20), make_host_pool(SPEC, 16, layout)
    loader = TransferEngine(device.pool, host, path=load_path)
    backer = TransferEngine(device.pool, host, path=backup_path)
    pages, slots = random_ids(9, 1, 20), torch.randperm(16)[:9]
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: backer.backup(pages, slots, options=backup_options))
    pairs = [pair for layer in range(SPEC.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: loader.load(slots, pages, options=load_options))


VARIANTS = [e for e in serving_probe.ELEVENTH + serving_probe.TWELFTH + serving_probe.THIRTEENTH + serving_probe.FOURTEENTH
            + serving_probe.NINETEENTH + serving_probe.TWENTYFIRST + serving_probe.TWENTYSECOND + serving_probe.TWENTYTHIRD
            + serving_probe.TWENTYFOURTH + serving_probe.TWENTYSIXTH
            + serving_probe.TWENTYSEVENTH + serving_probe.TWENTYEIGHTH + serving_probe.TWENTYNINTH
            + serving_probe.THIRTIETH if e[4] is not None]


def _changed_splits(change):
    """(table, key, split) of every policy entry ``change`` replaces."""
    import tiered_kv.transfers.policy as tp

    # By value: a change that rebuilds an entry equal to the policy's own would measure nothing.
    return [(name, key, change(split)) for name in serving_probe.PolicyVariant.TABLES
            for key, split in getattr(tp, name).items() if change(split) != split]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("slots_kind", ["runs", "scattered"])
@pytest.mark.parametrize("entry", VARIANTS, ids=lambda e: e[0])
def test_policy_variant_splits_copy_every_byte(entry, slots_kind, layout):
    """Each split an eleventh, twelfth or thirteenth candidate puts into the policy, with the
    candidate's own options (issue threads), run through ``mixed`` (on CPU ``auto`` resolves to
    torch copies, which would not run the split)."""
    changed = _changed_splits(entry[4])
    assert changed, entry[0]
    device, host = make_device_pool(SPEC, 20), make_host_pool(SPEC, 16, layout)
    engine = TransferEngine(device.pool, host, path="mixed")
    slots = torch.arange(3, 12) if slots_kind == "runs" else torch.randperm(16)[:9]
    pages = random_ids(9, 1, 20)
    pairs = [pair for layer in range(SPEC.num_layers) for pair in load_pairs(host, device.pool, layer)]
    for _, _, split in changed:
        options = replace(entry[2] or TransferOptions(), load_split=split)
        check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, options=options))


class SplitOf:
    """Stands in for an engine: ``load`` returns the split the policy gives now for its case."""

    def __init__(self, **case) -> None:
        self.case = case

    def load(self, *args, **kwargs):
        import tiered_kv.transfers.policy as tp

        return tp.choose_split(num_layers=61, has_batch=True, **self.case)


LF_SCATTERED_BESIDE_BACKUP = {"dense_host_rows": True, "scattered": True, "backup_in_flight": True}
PF_RUNS = {"dense_host_rows": False, "scattered": False, "backup_in_flight": False}


LF_SCATTERED = {"dense_host_rows": True, "scattered": True, "backup_in_flight": False}
PF_SCATTERED = {"dense_host_rows": False, "scattered": True, "backup_in_flight": False}
LF_RUNS = {"dense_host_rows": True, "scattered": False, "backup_in_flight": False}


def _case_named(name: str) -> dict:
    """The case a thirteenth candidate's name says it changes (``lf runs``, ``lf``, else ``pf`` scattered)."""
    return LF_RUNS if " lf runs " in name else LF_SCATTERED if " lf " in name else PF_SCATTERED


@pytest.mark.parametrize("entry, case", [(serving_probe.ELEVENTH[1], LF_SCATTERED_BESIDE_BACKUP),
                                         (serving_probe.ELEVENTH[2], LF_SCATTERED_BESIDE_BACKUP),
                                         (serving_probe.TWELFTH[1], PF_RUNS), (serving_probe.TWELFTH[2], PF_RUNS)]
                         + [(e, _case_named(e[0])) for e in serving_probe.THIRTEENTH[2:] + serving_probe.FOURTEENTH[1:]],
                         ids=lambda v: v[0] if isinstance(v, tuple) else "")
def test_policy_variant_gives_its_split_for_the_case_it_names_and_only_during_the_call(entry, case):
    import tiered_kv.transfers.policy as tp

    def split(**c):
        return tp.choose_split(num_layers=61, has_batch=True, **c)

    before = split(**case)
    got = serving_probe.PolicyVariant(SplitOf(**case), entry[4]).load()
    assert got == entry[4](before) and got != before  # the candidate's split, not the policy's
    assert split(**case) == before  # tables swapped back after the call
    other = dict(case, dense_host_rows=not case["dense_host_rows"])
    assert serving_probe.PolicyVariant(SplitOf(**other), entry[4]).load() == split(**other)  # other layout kept


def test_policy_changes_hit_only_the_entry_they_name():
    import tiered_kv.transfers.policy as tp

    changed = serving_probe.TWELFTH[1][4]
    assert changed(tp.MIXED_LOADS[(False, True)]) is not tp.MIXED_LOADS[(False, True)]
    for key in ((True, True), (True, False), (False, False)):
        assert changed(tp.MIXED_LOADS[key]) is tp.MIXED_LOADS[key]
    lf = serving_probe.ELEVENTH[1][4]
    assert lf(tp.SCATTERED_LOADS_BESIDE_BACKUP[True]).ce_fraction == 1.0
    assert lf(tp.SCATTERED_LOADS[False]) is tp.SCATTERED_LOADS[False]


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", [e for e in serving_probe.TWENTYFOURTH + serving_probe.TWENTYFIFTH
                                   + serving_probe.THIRTYFIRST if e[2] is not None],
                         ids=lambda e: e[0])
def test_option_candidates_copy_every_byte(entry, layout):
    """The candidates that change options (head blocks on the caller, device tables), under the
    policy's scattered split through ``mixed`` (``auto`` is torch copies on CPU)."""
    import tiered_kv.transfers.policy as tp

    name, _, options, _, change = entry
    split = tp.SCATTERED_LOADS[layout == "layer_first"]
    split = change(split) if change is not None else split
    _check_scattered_load(layout, "mixed", replace(options, load_split=split))


def _check_scattered_load(layout: str, path: str, options: TransferOptions) -> None:
    """A load of every layer from 9 of 16 host slots, in random order, through ``path`` with
    ``options``, checked byte for byte against the reference."""
    device, host = make_device_pool(SPEC, 20), make_host_pool(SPEC, 16, layout)
    engine = TransferEngine(device.pool, host, path=path)
    slots, pages = torch.randperm(16)[:9], random_ids(9, 1, 20)
    pairs = [pair for layer in range(SPEC.num_layers) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, pages, device.roots, lambda: engine.load(slots, pages, options=options))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", [e for e in serving_probe.THIRTYSECOND if e[2] is not None], ids=lambda e: e[0])
def test_thirtysecond_splits_copy_every_byte_and_differ_only_in_their_calls(entry, layout):
    """The idle copy-engine split for scattered ``layer_first`` loads, as one call for the blocks
    after the first and as a call per block: both land every byte of every layer."""
    name, path, options, _, _ = entry
    _check_scattered_load(layout, path, options)
    assert replace(options.load_split, lead_blocks=1) == serving_probe.CE_IDLE_LAYER_FIRST


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", [e for e in serving_probe.THIRTYTHIRD[len(serving_probe.THIRTYSECOND):]
                                   if e[0].startswith("ce ")], ids=lambda e: e[0])
def test_thirtythird_shares_copy_every_byte_and_change_only_the_share(entry, layout):
    """The idle copy-engine split at smaller copy-engine shares lands every byte of every layer and
    differs from the thirty-second set's only in ``ce_fraction``."""
    name, path, options, _, _ = entry
    _check_scattered_load(layout, path, options)
    split = options.load_split
    assert split.ce_fraction < serving_probe.CE_IDLE_LAYER_FIRST.ce_fraction
    assert replace(split, ce_fraction=serving_probe.CE_IDLE_LAYER_FIRST.ce_fraction) == serving_probe.CE_IDLE_LAYER_FIRST


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("entry", [e for e in serving_probe.THIRTYTHIRD if not e[0].startswith("ce ") and e[0] != "auto"],
                         ids=lambda e: e[0])
def test_thirtythird_reference_paths_copy_every_byte(entry, layout):
    """The kernel, batch-share and batch candidates the thirty-third set times beside the idle
    split land every byte of every layer, through the path ``transfer_gpu.CANDIDATES`` names."""
    name, path, options, _, _ = entry
    assert (path, options) == serving_probe.tg.CANDIDATES[name]
    _check_scattered_load(layout, path, options)
