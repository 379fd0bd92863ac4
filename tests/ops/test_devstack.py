"""scripts/dev-stack: start brings up redis-server, mooncake_master and the segment holder natively on
free loopback ports; replays against each store find the pages an earlier replay left there
(``pages_wrong`` 0); stop leaves no process behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "dev-stack"
SERVICES = ("redis", "mooncake-master", "segment-holder")

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


def stack_env(root: Path) -> dict[str, str]:
    # The loader reads every TIERED_KV_* variable as a config key: none of the caller's leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERED_KV_", "TKV_DEVSTACK_"))}
    env.update(TKV_DEVSTACK_DIR=str(root), TKV_DEVSTACK_REDIS_PORT="0", TKV_DEVSTACK_MOONCAKE_RPC_PORT="0",
               TKV_DEVSTACK_MOONCAKE_HTTP_PORT="0", TKV_DEVSTACK_MOONCAKE_METRICS_PORT="0",
               TKV_DEVSTACK_SEGMENT_BYTES="256MiB", TKV_DEVSTACK_REDIS_MAXMEMORY="256mb",
               TKV_DEVSTACK_PYTHON=sys.executable)
    return env


def dev_stack(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    if check:
        assert done.returncode == 0, f"dev-stack {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done


def running(pid: int) -> bool:
    """A live process (a zombie waiting for its reaper has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def replay(env: dict[str, str], config: str, url: str) -> dict:
    args = [sys.executable, "-m", "tiered_kv.ops.cli", "replay", "--config", f"examples/configs/{config}", "--l3", url,
            "--metrics-port", "0", "--clients", "3", "--rounds", "2", "--inflight", "1", "--json", "--quiet"]
    done = subprocess.run(args, env={**env, "MC_TCP_BIND_ADDRESS": "127.0.0.1"}, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_start_replay_against_each_store_stop(tmp_path):
    env = stack_env(tmp_path / "stack")
    pids: list[int] = []
    try:
        dev_stack(env, "start")
        pids = [int((tmp_path / "stack" / f"{s}.pid").read_text()) for s in SERVICES]
        assert all(running(p) for p in pids)
        status = dev_stack(env, "status")
        assert all(f"{s}: running" in status.stdout for s in SERVICES)
        urls = dict(line.split("=", 1) for line in (tmp_path / "stack" / "env").read_text().split())
        redis_url = urls["TKV_DEVSTACK_REDIS_URL"].strip("'")
        mooncake_url = urls["TKV_DEVSTACK_MOONCAKE_URL"].strip("'")
        assert redis_url.startswith("redis://127.0.0.1:") and "contribute_segment=false" in mooncake_url
        # Same settings as docker-compose.yml's redis service.
        config = subprocess.run(["redis-cli", "-u", redis_url, "config", "get", "maxmemory-policy"],
                                capture_output=True, text=True, timeout=10)
        assert config.stdout.split() == ["maxmemory-policy", "allkeys-lru"]
        # A second start keeps what runs (same pids, same ports).
        dev_stack(env, "start")
        assert [int((tmp_path / "stack" / f"{s}.pid").read_text()) for s in SERVICES] == pids
        for config_file, url in (("devstack-redis.yaml", redis_url), ("devstack-mooncake.yaml", mooncake_url)):
            first = replay(env, config_file, url)
            second = replay(env, config_file, url)  # a new process: L1 and L2 empty, L3 has the pages
            assert first["pages_wrong"] == 0 and second["pages_wrong"] == 0
            assert second["hit_tokens"]["l3"] > 0, (config_file, second["hit_tokens"])
            assert second["pages_verified"] > 0
            assert second["l3"] == url
    finally:
        stop = dev_stack(env, "stop", check=False)
    assert stop.returncode == 0, stop.stderr
    assert not [p for p in pids if running(p)], "a process outlived stop"
    after = dev_stack(env, "status", check=False)
    assert after.returncode == 3 and all(f"{s}: stopped" in after.stdout for s in SERVICES)
    assert not list((tmp_path / "stack").glob("*.pid"))


def test_bad_usage_and_bad_ports_are_refused(tmp_path):
    env = stack_env(tmp_path / "stack")
    usage = dev_stack(env, "restart", check=False)
    assert usage.returncode == 2 and "usage" in usage.stderr
    bad = dev_stack({**env, "TKV_DEVSTACK_REDIS_PORT": "70000"}, "start", "redis", check=False)
    assert bad.returncode == 1 and "70000" in bad.stderr
    unknown = dev_stack(env, "start", "memcached", check=False)
    assert unknown.returncode == 1 and "memcached" in unknown.stderr
    dev_stack(env, "stop")
