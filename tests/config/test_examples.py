"""examples/configs/ as a user runs them: each one loads, the ones the docs tell a user to replay
fit a 24 GiB machine, and none holds a metrics port that another example or the dev stack holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tiered_kv.config import load_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "configs").glob("*.yaml"))
#: The machine a user tries the examples on: the replay refuses tiers over 80% of its RAM.
SMALL_MACHINE_RAM = 24 << 30
#: Ports the dev stack's replays serve metrics on (docker-compose.yml), where its Prometheus scrapes.
DEV_STACK_METRICS = {"devstack-redis.yaml": 9400, "devstack-mooncake.yaml": 9400}


def replayed_in_docs() -> set[str]:
    """Example configs the README and docs/ show as ``tiered-kv replay --config examples/configs/X``."""
    texts = [(REPO / "README.md").read_text(), *(p.read_text() for p in (REPO / "docs").glob("*.md"))]
    return {m for text in texts for m in re.findall(r"tiered-kv replay --config examples/configs/(\S+\.yaml)", text)}


def test_examples_load():
    assert EXAMPLES
    for path in EXAMPLES:
        load_config(path, env={})


@pytest.mark.parametrize("name", sorted(replayed_in_docs()))
def test_examples_the_docs_replay_fit_a_24_gib_machine(name):
    config = load_config(REPO / "examples" / "configs" / name, env={})
    # Without a GPU, L1 is in RAM beside L2 (tiered_kv.compose refuses more than 80% of the RAM).
    ram = config.l1.size + config.l2.size
    assert ram <= 0.8 * SMALL_MACHINE_RAM, f"{name}: L1 + L2 take {ram / 2**30:.0f} GiB of RAM"


def test_docs_replay_the_local_ssd_example():
    assert "local-ssd.yaml" in replayed_in_docs()


def test_no_example_holds_a_metrics_port_of_another_or_of_the_dev_stack():
    ports: dict[int, str] = {}
    for path in EXAMPLES:
        metrics = load_config(path, env={}).metrics
        if not metrics.enabled:
            continue
        if path.name in DEV_STACK_METRICS:
            assert metrics.port == DEV_STACK_METRICS[path.name], path.name
            continue
        assert metrics.port not in {9400, 9401}, f"{path.name}: metrics on the dev stack's port {metrics.port}"
        assert metrics.port not in ports, f"{path.name} and {ports[metrics.port]} both serve metrics on {metrics.port}"
        ports[metrics.port] = path.name
