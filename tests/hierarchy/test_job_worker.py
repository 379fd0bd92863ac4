"""The worker side's dispatch: one handler per (source, destination) tier pair, results as data."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from tiered_kv import HostPool, allocate_engine_like
from tiered_kv.backends import open_backend
from tiered_kv.errors import ConfigError
from tiered_kv.hierarchy import L3Controller, TransferHalf
from tiered_kv.hierarchy.job_worker import JobWorker
from tiered_kv.hierarchy.jobs import Job, JobKind, JobResult, Tier
from tiered_kv.hierarchy.oracle import fill_pages, verify_pages

from .conftest import SPEC, assert_clean

ALL_ROUTES = {
    (Tier.L1, Tier.L2): JobKind.STORE,
    (Tier.L2, Tier.L1): JobKind.LOAD,
    (Tier.L3, Tier.L2): JobKind.PREFETCH,
    (Tier.L2, Tier.L3): JobKind.PUT,
    (Tier.L3, None): JobKind.EXISTS,
    (None, Tier.L3): JobKind.DELETE,
}


class FakeRunning:
    def __init__(self, job: Job, route) -> None:
        self.job, self.route, self.finished = job, route, False

    def done(self) -> bool:
        return self.finished

    def result(self) -> JobResult:
        return JobResult(self.job.job_id, self.job.kind, (True,) * len(self.job.keys), len(self.job.keys))


def test_the_whole_table_dispatches_by_source_and_destination():
    seen: dict = {}

    def fake(route):
        def handler(job):
            seen.setdefault(route, []).append(job.job_id)
            return FakeRunning(job, route)
        return handler

    worker = JobWorker(handlers={route: fake(route) for route in ALL_ROUTES})
    assert set(worker.handlers) == set(ALL_ROUTES)  # the table is exactly the six pairs
    jobs = [Job(i, kind, ("k",), (1,) if kind.source is Tier.L2 or kind.destination is Tier.L2 else (),
                (2,) if Tier.L1 in kind.route else ())
            for i, kind in enumerate(ALL_ROUTES.values())]
    worker.submit(jobs)
    assert seen == {route: [i] for i, route in enumerate(ALL_ROUTES)}
    assert worker.get_finished() == [] and worker.in_flight() == len(jobs)
    for running in worker._polled.values():
        running.finished = True
    results = worker.get_finished()
    assert sorted(r.job_id for r in results) == list(range(len(jobs)))
    assert worker.in_flight() == 0 and worker.get_finished() == []


def test_a_kind_without_its_tier_is_named():
    worker = JobWorker()
    with pytest.raises(ConfigError, match="no L3"):
        worker.submit([Job(1, JobKind.EXISTS, ("k",))])
    with pytest.raises(ConfigError, match="no L1 <-> L2"):
        worker.submit([Job(2, JobKind.STORE, ("k",), (0,), (1,))])
    with pytest.raises(ConfigError, match="takes Jobs"):
        worker.submit(["not a job"])


def _wait_results(worker: JobWorker, count: int, timeout_s: float = 20.0) -> dict[int, JobResult]:
    got: dict[int, JobResult] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"{count - len(got)} jobs never finished"
        got.update({r.job_id: r for r in worker.get_finished()})
        time.sleep(0.001)
    return got


def test_real_moves_through_every_pair(tmp_path):
    """L1 -> L2 -> L3 -> L2 -> L1 by jobs alone, checked byte for byte at the end."""
    host = HostPool(SPEC, 8)
    device = allocate_engine_like(SPEC, 5)
    controller = L3Controller(lambda: open_backend(f"file://{tmp_path}/l3", host), record_bytes=host.record_bytes)
    worker = JobWorker(TransferHalf(device, host), controller)
    keys = [f"{i:064x}" for i in range(1, 4)]
    try:
        fill_pages(device, keys, [1, 2, 3])
        slots = host.allocate(6)
        worker.submit([Job(1, JobKind.STORE, keys, slots[:3], (1, 2, 3))])
        assert _wait_results(worker, 1)[1].ok == (True,) * 3
        assert all(host.is_sealed(s, k) for s, k in zip(slots[:3], keys))  # sealed once landed
        worker.submit([Job(2, JobKind.PUT, keys, slots[:3])])
        assert _wait_results(worker, 1)[2].count == 3
        worker.submit([Job(3, JobKind.EXISTS, keys + ["f" * 64])])
        exists = _wait_results(worker, 1)[3]
        assert exists.count == 3 and exists.ok == (True, True, True, False) and exists.heard
        worker.submit([Job(4, JobKind.PREFETCH, keys, slots[3:])])
        assert _wait_results(worker, 1)[4].ok == (True,) * 3
        fill_pages(device, [f"{i:064x}" for i in range(7, 10)], [1, 2, 3])  # L1 overwritten
        assert verify_pages(device, keys, [3, 2, 1]) == [False] * 3
        worker.submit([Job(5, JobKind.LOAD, keys, slots[3:], (3, 2, 1))])
        assert worker.load_handle(5) is not None  # per-layer waits while in flight
        _wait_results(worker, 1)
        assert verify_pages(device, keys, [3, 2, 1]) == [True] * 3
        worker.submit([Job(6, JobKind.DELETE, keys[:1]), Job(7, JobKind.EXISTS, keys)])
        results = _wait_results(worker, 2)
        assert results[6].ok == (True,) and results[7].count == 0  # the chain starts at the deleted key
        host.free(slots)
    finally:
        worker.close()
    assert_clean(host, controller)
    host.close()


def test_l3_results_come_back_through_the_listener(tmp_path):
    host = HostPool(SPEC, 4)
    heard: concurrent.futures.Future = concurrent.futures.Future()
    controller = L3Controller(lambda: open_backend(f"file://{tmp_path}/l3", host), record_bytes=host.record_bytes)
    worker = JobWorker(None, controller, listener=heard.set_result)
    try:
        worker.submit([Job(9, JobKind.EXISTS, ("a" * 64,))])
        result = heard.result(timeout=10)
        assert result.job_id == 9 and result.count == 0 and result.heard
        assert worker.get_finished() == []  # handed over once, through the listener
    finally:
        worker.close()
    assert_clean(host, controller)
    host.close()


def test_a_load_jobs_worker_side_handle_completes_layer_by_layer():
    """The model runner lives with the worker side: it waits on each layer of a LOAD job through
    ``load_handle``, while the scheduler side only ever hears of the whole load."""
    from tiered_kv.errors import IndexValidationError

    host = HostPool(SPEC, 4)
    device = allocate_engine_like(SPEC, 4)
    worker = JobWorker(TransferHalf(device, host))
    keys = [f"{i:064x}" for i in range(11, 14)]
    try:
        fill_pages(device, keys, [1, 2, 3])
        slots = host.allocate(3)
        worker.submit([Job(1, JobKind.STORE, keys, slots, (1, 2, 3))])
        _wait_results(worker, 1)
        fill_pages(device, [f"{i:064x}" for i in range(21, 24)], [1, 2, 3])
        worker.submit([Job(2, JobKind.LOAD, keys, slots, (3, 2, 1))])
        handle = worker.load_handle(2)
        assert handle.layers == tuple(range(SPEC.num_layers))
        for layer in handle.layers:
            handle.wait_layer(layer)  # the runner's wait before computing that layer
            assert handle.layer_done(layer)
        with pytest.raises(IndexValidationError, match="not part of this load"):
            handle.wait_layer(SPEC.num_layers)
        assert verify_pages(device, keys, [3, 2, 1]) == [True] * 3
        assert _wait_results(worker, 1)[2].ok == (True,) * 3
        assert worker.load_handle(2) is None  # gone once its result was handed back
        host.free(slots)
    finally:
        worker.close()
    assert_clean(host, None)
    host.close()
