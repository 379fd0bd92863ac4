"""A paced copy-engine half (``LoadSplit.pace_gbps``): its blocks go into the staging ring one call
each while the issuing thread keeps up with the pace; once a block is due before the thread gets
to it, that block and every later one go through the UVA kernel in one launch, and the load still
lands every byte of every layer.

On CPU the ring and the kernel copy at once, so which blocks went which way shows in the ring's
calls, and the clock the pace counts by is the engine's (``_clock``), which the tests drive.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch

if not torch.cuda.is_available():  # kernels through Triton's interpreter on CPU-only machines
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tiered_kv import ConfigError, nsa_spec  # noqa: E402
from tiered_kv.transfer_engine import TransferEngine, TransferOptions, _blocks  # noqa: E402
from tiered_kv.transfer_policy import IDLE_SCATTERED_LOADS, PACE_GBPS, LoadSplit  # noqa: E402

from .kernels.pools import make_device_pool, make_host_pool, random_fill, random_ids  # noqa: E402

LAYERS = 12
PACED = replace(IDLE_SCATTERED_LOADS[True], pace_gbps=PACE_GBPS)


def _landed(device, host, slots, pages) -> list[bool]:
    return [all(torch.equal(device.pool.chunk_view(ci, layer)[pages], host.chunk_view(ci, layer)[slots])
                for ci in range(len(host.spec.components))) for layer in range(LAYERS)]


class _Clock:
    """The engine's clock: 0 when the load starts (its first reading) and until ``late`` says the
    thread is late, then an hour on."""

    def __init__(self, late) -> None:
        self.late = late
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return 3600.0 if self.readings > 1 and self.late() else 0.0


def _load(late, split=PACED, layout="layer_first"):
    """A paced load of scattered slots on CPU; the ring's calls, the engine and whether every
    layer landed."""
    spec = nsa_spec(num_layers=LAYERS, page_size=4)
    device, host = make_device_pool(spec, 40, "cpu"), make_host_pool(spec, 48, layout)
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=split))
    ring = engine.staging_copier("load")
    calls = []
    real = ring.to_device_groups

    def counted(groups, *args, **kwargs):
        calls.append(len(groups))
        return real(groups, *args, **kwargs)

    ring.to_device_groups = counted
    engine._clock = _Clock(lambda: late(len(calls)))
    slots, pages = random_ids(11, 0, 48), random_ids(11, 1, 40)
    random_fill(device.roots)
    handle = engine.load(slots, pages)
    handle.synchronize()
    return calls, engine, _landed(device, host, slots, pages)


def test_a_half_that_keeps_up_goes_block_by_block_through_the_ring():
    calls, engine, landed = _load(lambda ring_calls: False)
    blocks = _blocks(LAYERS, PACED)
    assert calls == [1] * len(blocks) and len(blocks) > 1  # one call per block, no fallback
    assert engine.pace_fallbacks == 0
    assert all(landed)


@pytest.mark.parametrize("late_after", [0, 1, 3])
def test_a_half_that_falls_behind_hands_the_rest_to_the_kernel(late_after):
    calls, engine, landed = _load(lambda ring_calls: ring_calls >= late_after)
    assert len(calls) == late_after  # blocks before it went through the ring, none after
    assert engine.pace_fallbacks == 1
    assert all(landed)  # the kernel landed the copy engines' share of every later block


def test_a_paced_page_first_load_lands_too():
    split = LoadSplit(0.5, layers_per_copy=4, kernel_blocks=4, ramp=True, pace_gbps=10.0)
    calls, engine, landed = _load(lambda ring_calls: ring_calls >= 2, split=split, layout="page_first")
    assert len(calls) == 2 and engine.pace_fallbacks == 1 and all(landed)


def test_the_pace_is_late_only_once_the_block_is_due():
    # Due times follow the bytes before each block at the pace, after the slack: a real clock at
    # a pace no CPU falls behind (1 GB per microsecond) with an hour of slack never falls back.
    split = replace(PACED, pace_gbps=1e6, pace_slack_ms=3.6e6)
    spec = nsa_spec(num_layers=LAYERS, page_size=4)
    device, host = make_device_pool(spec, 40, "cpu"), make_host_pool(spec, 48, "layer_first")
    engine = TransferEngine(device.pool, host, path="mixed", options=TransferOptions(load_split=split))
    slots, pages = random_ids(11, 0, 48), random_ids(11, 1, 40)
    engine.load(slots, pages).synchronize()
    assert engine.pace_fallbacks == 0
    assert all(_landed(device, host, slots, pages))


@pytest.mark.parametrize("bad", [{"pace_gbps": 0}, {"pace_gbps": -1.0}, {"pace_gbps": True}, {"pace_gbps": "fast"},
                                 {"pace_gbps": float("inf")}, {"pace_slack_ms": -1}, {"pace_slack_ms": None},
                                 {"pace_gbps": 40.0, "ce_path": "batch"}, {"pace_gbps": 40.0, "issue_halves": 2},
                                 {"pace_gbps": 40.0, "minor_layers_per_copy": 8}])
def test_bad_paces_are_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match="LoadSplit.pace_"):
        LoadSplit(0.8, **bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("late_after", [None, 0, 2])
def test_gpu_paced_loads_land_every_byte_with_and_without_the_fallback(late_after):
    spec = nsa_spec(num_layers=61, page_size=64)
    device, host = make_device_pool(spec, 300, "cuda"), make_host_pool(spec, 400, "layer_first")
    with host:  # unpins at the end
        engine = TransferEngine(device.pool, host, path="auto")
        ring = engine.staging_copier("load")
        calls = []
        real = ring.to_device_groups

        def counted(groups, *args, **kwargs):
            calls.append(len(groups))
            return real(groups, *args, **kwargs)

        ring.to_device_groups = counted
        engine._clock = _Clock(lambda: late_after is not None and len(calls) >= late_after)
        slots, pages = random_ids(128, 0, 400), random_ids(128, 1, 300)  # scattered: auto's paced split
        random_fill(device.roots)
        handle = engine.load(slots, pages)
        handle.synchronize()
        assert handle.path == "mixed"
        assert engine.pace_fallbacks == (0 if late_after is None else 1)
        assert len(calls) == (len(_blocks(61, PACED)) if late_after is None else late_after)
        pages_dev = pages.cuda()
        for layer in range(61):
            for ci in range(len(spec.components)):
                assert torch.equal(device.pool.chunk_view(ci, layer)[pages_dev].cpu(), host.chunk_view(ci, layer)[slots])
