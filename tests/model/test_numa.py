"""Placing the host pool on a NUMA node: cpulist parsing and the affinity dance, on a fake sysfs."""

from __future__ import annotations

import os

from tiered_kv import HostPool, nsa_spec
from tiered_kv.model.numa import node_cpus, on_node, parse_cpulist


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("5") == {5}
    assert parse_cpulist("") == set()


def fake_sysfs(tmp_path, cpulist: str):
    node = tmp_path / "devices/system/node/node1"
    node.mkdir(parents=True)
    (node / "cpulist").write_text(cpulist)
    return tmp_path


def test_on_node_restricts_then_restores(tmp_path):
    allowed = os.sched_getaffinity(0)
    one = min(allowed)
    sysfs = fake_sysfs(tmp_path, str(one))
    assert node_cpus(1, sysfs) == {one}
    with on_node(1, sysfs) as placed:
        assert placed is True
        if len(allowed) > 1:
            assert os.sched_getaffinity(0) == {one}
    assert os.sched_getaffinity(0) == allowed


def test_unknown_node_changes_nothing(tmp_path):
    allowed = os.sched_getaffinity(0)
    with on_node(7, tmp_path) as placed:
        assert placed is False
        assert os.sched_getaffinity(0) == allowed
    with on_node(None) as placed:
        assert placed is False


def test_host_pool_on_node_zero():
    with HostPool(nsa_spec(num_layers=2), 2, numa_node=0) as pool:
        assert pool.memory.numa_node == (0 if os.path.exists("/sys/devices/system/node/node0/cpulist") else None)
