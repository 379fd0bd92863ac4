"""benchmarks/beside_floor.py's ``streams`` set: each loader measured with the engine's own streams
and with torch's pool streams, and the probe's engine maker leaves the process's lender as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import beside_floor as bf  # noqa: E402

from tiered_kv import nsa_spec  # noqa: E402
from tiered_kv.kernels import owned_streams  # noqa: E402

from .kernels.pools import make_device_pool, make_host_pool  # noqa: E402


def test_the_streams_set_pairs_every_loader_owned_and_pool():
    entries = bf.SETS["streams"]
    owned = [e for e in entries if not e[5]]
    pool = [e for e in entries if e[5] == bf.POOL_STREAMS]
    assert len(owned) == len(pool) == 4 and len(entries) == 8
    assert [e[1:5] for e in owned] == [e[1:5] for e in pool]  # same layout, slots, path, options
    assert {(e[1], e[2]) for e in owned} == {(layout, kind) for layout in ("page_first", "layer_first")
                                             for kind in ("runs", "scattered")}


def test_make_engine_restores_the_lender_and_keeps_the_probes_kwarg_from_the_engine():
    spec = nsa_spec(num_layers=2, page_size=4)
    device, host = make_device_pool(spec, 8, "cpu"), make_host_pool(spec, 8, "page_first")
    before = owned_streams.default_lender
    pool_engine = bf.make_engine(device.pool, host, "auto", bf.POOL_STREAMS)
    assert owned_streams.default_lender is before
    assert not pool_engine._streams.owned
    own = bf.make_engine(device.pool, host, "auto", {})
    assert own._streams.owned == (torch.cuda.is_available() and owned_streams.default_lender() is not None)
