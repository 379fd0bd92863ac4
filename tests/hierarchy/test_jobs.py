"""Jobs and results are plain data: they pickle, cross a pipe, and check their own ids."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

from tiered_kv.errors import ConfigError
from tiered_kv.hierarchy.jobs import Job, JobKind, JobResult, Tier

JOBS = [
    Job(1, JobKind.STORE, ("a", "b"), (3, 4), (7, 8)),
    Job(2, JobKind.LOAD, ("a",), (3,), (9,)),
    Job(3, JobKind.PREFETCH, ("c", "d"), (5, 6)),
    Job(4, JobKind.PUT, ("a",), (3,)),
    Job(5, JobKind.EXISTS, ("a", "b", "c")),
    Job(6, JobKind.DELETE, ("a",)),
]


def test_every_kind_has_its_own_route():
    routes = {kind.route for kind in JobKind}
    assert len(routes) == len(JobKind)
    assert JobKind.STORE.route == (Tier.L1, Tier.L2) and JobKind.LOAD.route == (Tier.L2, Tier.L1)
    assert JobKind.PREFETCH.route == (Tier.L3, Tier.L2) and JobKind.PUT.route == (Tier.L2, Tier.L3)


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.kind.name)
def test_jobs_and_results_pickle(job):
    assert pickle.loads(pickle.dumps(job)) == job
    result = JobResult(job.job_id, job.kind, (True,) * len(job.keys), len(job.keys), l3_degraded=True)
    assert pickle.loads(pickle.dumps(result)) == result
    lost = JobResult.failed(job, lost=True)
    assert lost.ok == (False,) * len(job.keys) and lost.lost and not lost.heard


def test_jobs_cross_a_pipe():
    here, there = multiprocessing.get_context("spawn").Pipe()
    try:
        for job in JOBS:
            here.send(job)
            assert there.recv() == job
    finally:
        here.close()
        there.close()


def test_ids_are_plain_ints_and_strs():
    import numpy as np

    job = Job(7, JobKind.PUT, ["k"], [np.int64(3)])
    assert job.slots == (3,) and type(job.slots[0]) is int and job.keys == ("k",)


@pytest.mark.parametrize("bad, what", [
    (lambda: Job(1, JobKind.PUT, ("a", "b"), (1,)), "2 keys but 1 slots"),
    (lambda: Job(1, JobKind.STORE, ("a",), (1,)), "1 keys but 0 pages"),
    (lambda: Job(1, JobKind.EXISTS, ("a",), (1,)), "takes no slots"),
    (lambda: Job("1", JobKind.EXISTS, ("a",)), "job_id must be an int"),
    (lambda: Job(1, "put", ("a",)), "kind must be a JobKind"),
])
def test_bad_jobs_are_named(bad, what):
    with pytest.raises(ConfigError, match=what):
        bad()
