"""A real Prometheus (Debian's /usr/bin/prometheus) scrapes a replay's metrics endpoint; the hit
counters read back through its HTTP API equal the replay's own ``--json`` totals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.backends.mooncake_server import free_port
from tests.ops.replay.conftest import TINY_CHAT, TINY_TIERS
from tiered_kv.ops.plan import slot_bytes
from tiered_kv.ops.replay import embedded_default

REPO = Path(__file__).resolve().parents[2]
#: Below TINY_TIERS' L2, and one request at a time: hits on all three tiers, independent of timing.
L2_PAGES = 30
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)


class Prometheus:
    """``prometheus`` on 127.0.0.1 (a free port, storage in ``root``) scraping ``target`` every second."""

    def __init__(self, root: Path, target: str) -> None:
        self.port = free_port()
        config = root / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                          f"scrape_configs:\n  - job_name: replay\n    static_configs:\n"
                          f"      - targets: ['{target}']\n")
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1) as reply:
                return reply.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.load(reply)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(tmp_path, metrics_port):
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus; .ci/run installs it)")
    server = Prometheus(tmp_path, f"127.0.0.1:{metrics_port}")
    try:
        yield server
    finally:
        server.stop()
    assert server.process.returncode is not None


def test_prometheus_reads_the_replays_hit_counters(prometheus, metrics_port):
    spec = embedded_default().spec
    w = TINY_CHAT
    args = [sys.executable, "-m", "tiered_kv.ops.cli", "replay", "--json", "--quiet",
            "--clients", str(w.clients), "--rounds", str(w.rounds), "--system-tokens", str(w.system_tokens),
            "--turn-tokens", str(w.turn_tokens), "--answer-tokens", str(w.answer_tokens), "--seed", str(w.seed),
            "--gpu-mem", str(TINY_TIERS["l1_pages"] * spec.page_bytes),
            "--host-mem", str(L2_PAGES * slot_bytes(spec)), "--inflight", "1",
            "--metrics-port", str(metrics_port), "--hold-s", "30"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_KV_")}
    # SIGINT as a terminal delivers it, also when this suite runs from a shell that ignores it (an
    # ignored SIGINT is inherited: ``nohup ... &`` from a script left the hold running out instead).
    replay = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = replay.stdout.readline()  # printed (flushed) before the hold
        assert line, replay.stderr.read()
        summary = json.loads(line)
        assert summary["pages_wrong"] == 0
        want = {t: float(summary["hit_tokens"][t]) for t in ("l1", "l2", "l3")}
        assert all(want.values()), want  # hits on every tier, so every counter is checked
        got: dict[str, float] = {}
        deadline = time.monotonic() + 20
        while got != want and time.monotonic() < deadline:
            got = {r["metric"]["tier"]: float(r["value"][1]) for r in prometheus.query("tiered_kv_hit_tokens_total")}
            time.sleep(0.5)
        assert got == want
        pages = {r["metric"]["tier"]: float(r["value"][1]) for r in prometheus.query("tiered_kv_hit_pages_total")}
        assert {t: v * summary["page_size"] for t, v in pages.items()} == want
        up = prometheus.query('up{job="replay"}')
        assert [float(r["value"][1]) for r in up] == [1.0]
        replay.send_signal(signal.SIGINT)  # ends the hold
        assert replay.wait(30) == 130
    finally:
        if replay.poll() is None:
            replay.kill()
            replay.wait()
        replay.stdout.close()
        replay.stderr.close()
