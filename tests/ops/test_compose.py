"""docker-compose.yml: valid for docker-compose, the services it promises, files it references
present, health checks, pinned images, ports on 127.0.0.1 only and in step with the example configs
and scripts/dev-stack."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tiered_kv.config import load_config

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
SERVICES = {"redis", "mooncake-master", "segment-holder", "prometheus", "grafana", "replay", "replay-mooncake"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_docker_compose_config_accepts_the_file():
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose; .ci/run installs it)")
    # --profile: the mooncake replay is checked as well; no engine is needed for `config`.
    done = subprocess.run([binary, "-f", str(COMPOSE), "--profile", "mooncake", "config", "--services"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == SERVICES
    assert "WARNING" not in done.stderr, done.stderr


def test_services_health_checks_and_pinned_images(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    for name, svc in services.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        image = svc.get("image")
        assert image, f"{name} names no image"
        tag = image.rpartition(":")[2]
        assert ":" in image and tag != "latest" and re.search(r"\d", tag), f"{name}: image {image!r} is not pinned"
    redis = " ".join(services["redis"]["command"])
    assert "--maxmemory 2gb" in redis and "--maxmemory-policy allkeys-lru" in redis and "--disable-thp no" in redis
    assert services["redis"]["environment"]["MALLOC_CONF"] == "thp:always,dirty_decay_ms:-1,muzzy_decay_ms:-1"
    assert "--enable_http_metadata_server=true" in services["mooncake-master"]["command"]
    holder = " ".join(services["segment-holder"]["command"])
    assert "hold-segment" in holder and "global_segment_bytes=" in holder
    assert "replay" in services["replay"]["command"] and "--config" in services["replay"]["command"]


def test_every_referenced_file_exists(compose):
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if build is not None:
            context = REPO / build["context"]
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            assert (REPO / source).exists(), f"{name}: {source} missing"
        command = svc.get("command", [])
        for i, arg in enumerate(command):
            if arg == "--config":
                assert (REPO / command[i + 1]).is_file(), f"{name}: {command[i + 1]} missing"
    # Files the Dockerfiles copy in
    for dockerfile in (REPO / "docker").glob("*/Dockerfile"):
        for source in re.findall(r"^COPY (.+) \S+$", dockerfile.read_text(), re.M):
            for path in source.split():
                assert (REPO / path).exists(), f"{dockerfile}: COPY {path} missing"
    dash = REPO / "docker" / "grafana" / "provisioning" / "dashboards" / "tiered-kv.yml"
    assert yaml.safe_load(dash.read_text())["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (REPO / "dashboards" / "tiered-kv.json").is_file()


def published(compose) -> dict[str, dict[int, int]]:
    """service -> {container port: host port}, asserting every one is bound to 127.0.0.1."""
    out: dict[str, dict[int, int]] = {}
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            host, host_port, container_port = str(port).split(":")
            assert host == "127.0.0.1", f"{name}: {port} is not bound to 127.0.0.1"
            out.setdefault(name, {})[int(container_port)] = int(host_port)
    return out


def test_ports_are_loopback_and_agree_with_configs_and_dev_stack(compose):
    ports = published(compose)
    redis = load_config(REPO / "examples/configs/devstack-redis.yaml", env={})
    mooncake = load_config(REPO / "examples/configs/devstack-mooncake.yaml", env={})
    assert ports["redis"] == {6379: urlsplit(redis.l3.url).port}
    master = mooncake.l3.backend_options()
    rpc = int(master.master.rpartition(":")[2])
    http = urlsplit(master.metadata_server).port
    assert {rpc, http} <= set(ports["mooncake-master"].values())
    assert master.contribute_segment is False  # the segment holder contributes the memory
    assert ports["replay"] == {redis.metrics.port: redis.metrics.port}
    assert mooncake.metrics.port in ports["replay-mooncake"]
    # The container's flags listen where the ports are published.
    flags = dict(a.lstrip("-").split("=", 1) for a in compose["services"]["mooncake-master"]["command"])
    assert {int(flags["rpc_port"]), int(flags["http_metadata_server_port"]), int(flags["metrics_port"])} \
        == set(ports["mooncake-master"])
    # scripts/dev-stack's defaults are the same ports.
    script = (REPO / "scripts" / "dev-stack").read_text()
    defaults = dict(re.findall(r"\$\{TKV_DEVSTACK_(\w+_PORT):-(\d+)\}", script))
    assert {k: int(v) for k, v in defaults.items()} == {
        "REDIS_PORT": 6379, "MOONCAKE_RPC_PORT": rpc, "MOONCAKE_HTTP_PORT": http,
        "MOONCAKE_METRICS_PORT": int(flags["metrics_port"])}
    # Prometheus scrapes the replays where they serve.
    prom = yaml.safe_load((REPO / "docker" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for group in job["static_configs"] for t in group["targets"]}
    assert {f"replay:{redis.metrics.port}", f"replay-mooncake:{mooncake.metrics.port}"} <= targets
    assert compose["services"]["replay"]["environment"]["TIERED_KV_METRICS__HOST"] == "0.0.0.0"


def _dockerfiles(compose: dict) -> list[Path]:
    out = []
    for svc in compose["services"].values():
        build = svc.get("build")
        if isinstance(build, dict):
            out.append(REPO / build.get("context", ".") / build.get("dockerfile", "Dockerfile"))
        elif isinstance(build, str):
            out.append(REPO / build / "Dockerfile")
    return sorted(set(out))


def test_commands_copied_onto_the_path_are_made_executable(compose):
    """A health check runs ``tiered-kv-healthcheck`` by name; COPY keeps the build context's mode,
    and the script is 0644 in the repository, so the image must chmod what it puts on the PATH.
    (Before: the segment holder's and the replays' health checks failed 'permission denied' and
    replay-mooncake, which waits for a healthy segment holder, never started.)"""
    checked = 0
    for dockerfile in _dockerfiles(compose):
        text = dockerfile.read_text()
        for line in text.splitlines():
            parts = line.split()
            if not parts or parts[0].upper() != "COPY":
                continue
            flags = [p for p in parts[1:] if p.startswith("--")]
            target = [p for p in parts[1:] if not p.startswith("--")][-1]
            if not target.startswith(("/usr/local/bin/", "/usr/bin/")):
                continue
            checked += 1
            chmod = any(re.fullmatch(r"--chmod=0?[1357][0-7]{2}", f) for f in flags)
            assert chmod or re.search(rf"RUN\s+chmod\s+\S*\s*{re.escape(target)}", text), \
                f"{dockerfile.relative_to(REPO)}: {target} is copied but never made executable"
    assert checked, "no command is copied onto the PATH any more: update this test"
    used = {" ".join(svc["healthcheck"]["test"]) for svc in compose["services"].values()}
    assert any("tiered-kv-healthcheck" in u for u in used)
