"""The host-gather probe's movers (benchmarks/host_gather_probe.py) on CPU: a gather takes exactly
the indexed rows in order and a scatter writes exactly those rows, however the rows are cut into
chunks across threads, so the H200 numbers measure copies that were right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import host_gather_probe as hg  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_threads_kept():
    """The movers set torch's intra-op thread count (process-wide); the rest of the suite keeps its own."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("n, parts", [(10, 3), (512, 8), (3, 8), (16, 16)])
def test_chunks_cover_every_row_once(n, parts):
    covered = [i for part in hg.chunks(n, parts) for i in range(n)[part]]
    assert covered == list(range(n)) and len(hg.chunks(n, parts)) <= parts


@pytest.mark.parametrize("threads, pool, numpy", [(1, False, False), (3, True, False), (4, False, False),
                                                  (5, True, False), (1, True, True), (3, True, True)])
def test_gather_then_scatter_moves_exactly_the_indexed_rows(threads, pool, numpy):
    g = torch.Generator().manual_seed(threads)
    sources = [torch.randint(0, 256, (40, w), dtype=torch.uint8, generator=g) for w in (96, 24)]
    idx = torch.randperm(40, generator=g)[:13]
    outs = [torch.empty(13, s.shape[1], dtype=torch.uint8) for s in sources]
    mover = hg.Mover(threads, pool, numpy)
    try:
        mover.gather([(s, idx, o) for s, o in zip(sources, outs)])
        for s, o in zip(sources, outs):
            assert torch.equal(o, s[idx])
        targets = [torch.zeros_like(s) for s in sources]
        back = torch.randperm(40, generator=g)[:13]
        mover.scatter([(t, back, o) for t, o in zip(targets, outs)])
        for t, s in zip(targets, sources):
            assert torch.equal(t[back], s[idx])
            untouched = torch.ones(40, dtype=torch.bool)
            untouched[back] = False
            assert not t[untouched].any()  # no row outside the index was written
    finally:
        mover.close()


def test_numpy_mover_needs_its_own_threads():
    with pytest.raises(ValueError, match="pool=True"):
        hg.Mover(2, False, numpy=True)


def test_mover_kinds_name_what_they_measure():
    assert {hg.Mover(2, pool, numpy).name() for pool, numpy in hg.MOVER_KINDS["all"]} == {
        "intra-op 2", "2 python threads", "2 numpy threads"}
    assert all(numpy for _, numpy in hg.MOVER_KINDS["numpy"]) and not any(n for _, n in hg.MOVER_KINDS["torch"])
