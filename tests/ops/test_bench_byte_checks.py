"""The GPU benchmark's byte checks (``transfer_gpu.backup_copies_every_byte`` /
``load_copies_every_byte``, run on every path before anything is timed) on CPU pools: true after a
transfer that copied every byte, false where one page was not copied, so a GPU run cannot time a
wrong path."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import transfer_gpu as tg

from tiered_kv.transfers.engine import TransferEngine

from ..kernels.pools import make_device_pool, make_host_pool, small_specs


class DropsOnePage:
    """An engine that moves every page but the last of each call (what a broken path might do)."""

    def __init__(self, engine: TransferEngine) -> None:
        self.engine = engine

    def backup(self, pages, slots, **kwargs):
        return self.engine.backup(pages[:-1], slots[:-1], **kwargs)

    def load(self, slots, pages, **kwargs):
        return self.engine.load(slots[:-1], pages[:-1], **kwargs)


def test_the_checks_pass_a_whole_copy_and_fail_a_missing_page():
    spec = small_specs()["nsa"]
    device, host = make_device_pool(spec, 20), make_host_pool(spec, 16, "layer_first")
    engine = TransferEngine(device.pool, host, path="torch")
    pages, slots = torch.tensor([3, 7, 1, 12]), torch.tensor([9, 2, 14, 5])
    assert tg.backup_copies_every_byte(engine, device.pool, host, pages, slots)
    assert tg.load_copies_every_byte(engine, device.pool, host, slots, torch.tensor([4, 8, 11, 15]))
    broken = DropsOnePage(engine)
    # The load first: its source slots still hold the pages' random bytes, the dropped page's
    # destination keeps the poison.
    assert not tg.load_copies_every_byte(broken, device.pool, host, slots, torch.tensor([4, 8, 11, 15]))
    assert not tg.backup_copies_every_byte(broken, device.pool, host, pages, slots)  # the poisoned slot stays 0


def test_issue_pair_issues_in_the_order_it_names():
    """The both-at-once groups issue the pair as labelled: the backup first unless told otherwise."""
    for order, expected in (("backup first", ["backup", "load"]), ("load first", ["load", "backup"])):
        issued = []
        handles = tg.issue_pair(lambda: issued.append("load") or "L", lambda: issued.append("backup") or "B", order)
        assert issued == expected and sorted(handles) == ["B", "L"]


def test_check_paths_names_the_engine_that_lost_a_page():
    """The benchmark's gate: every engine but the reference checked for both ops and both kinds of
    slots, one row each, and only the broken engine's rows fail."""
    spec = small_specs()["nsa"]
    device, host = make_device_pool(spec, 20), make_host_pool(spec, 16, "page_first")
    engines = {("page_first", "kernel"): TransferEngine(device.pool, host, path="kernel"),
               ("page_first", "staged"): DropsOnePage(TransferEngine(device.pool, host, path="staged")),
               ("page_first", "torch"): DropsOnePage(TransferEngine(device.pool, host, path="torch"))}
    slot_sets = {"runs": [torch.arange(3, 7)], "scattered": [torch.tensor([9, 2, 14, 5])]}
    checks = tg.check_paths(engines, device.pool, {"page_first": host}, torch.tensor([3, 7, 1, 12]), slot_sets)
    assert {(c["path"], c["op"], c["slots"]) for c in checks} == {
        (path, op, slots) for path in ("kernel", "staged") for op in ("backup", "load") for slots in ("runs", "scattered")}
    assert all(c["ok"] == (c["path"] == "kernel") for c in checks)
