"""How the ``tiered-kv`` process starts and stops: commands that need no tensors load no torch,
the package's names are imported on first use, and SIGINT / SIGTERM end a command with one line
and its cleanup done (a replay's temporary L3 directory removed).

Each case runs the CLI in a fresh interpreter: what a module import loads shows only there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Runs ``tiered_kv.ops.cli.main(argv)`` and prints, as its last stdout line, the exit code and whether
#: torch was loaded by then.
PROBE = """
import json, sys
from tiered_kv.ops.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the caller's config (the loader reads every TIERED_KV_* variable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_KV_")}
    env.update(extra)
    return env


def probe(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=clean_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [
    ["--version"],
    ["config", "check", "examples/configs/embedded.yaml"],
    ["config", "show"],
    ["plan"],
    ["plan", "--model", "llama-3.1-8b", "--json"],
    ["inspect", "file://{tmp}"],
    ["plan", "--page-size", "0"],  # a usage error: no torch either
])
def test_commands_that_need_no_tensors_do_not_import_torch(argv, tmp_path):
    result = probe(*(a.format(tmp=tmp_path) for a in argv))
    assert result["code"] == (2 if "0" in argv else 0)
    assert result["torch"] is False, f"tiered-kv {' '.join(argv)} imported torch"


def test_import_tiered_kv_loads_no_torch_and_every_export_still_imports():
    code = """
import sys, tiered_kv
assert "torch" not in sys.modules, "import tiered_kv loaded torch"
from tiered_kv import *
from tiered_kv import TransferEngine, TransferOptions
from tiered_kv.transfers.engine import TransferEngine as Engine, TransferOptions as Options
assert TransferEngine is Engine and TransferOptions is Options
assert {"TransferEngine", "TransferOptions"} <= set(tiered_kv.__all__) <= set(dir(tiered_kv))
missing = [name for name in tiered_kv.__all__ if name not in globals()]
assert not missing, missing
try:
    tiered_kv.NoSuchName
except AttributeError as exc:
    assert "NoSuchName" in str(exc)
else:
    raise AssertionError("tiered_kv.NoSuchName did not raise AttributeError")
print(len(tiered_kv.__all__))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 40


# --- signals -------------------------------------------------------------------------------------
def start_replay(tmp_path: Path, *args: str) -> subprocess.Popen:
    """``tiered-kv replay`` with its temporary directories in ``tmp_path`` (TMPDIR)."""
    # SIGINT back to its default in the child: a runner started in the background of a shell
    # ignores it, and an ignored SIGINT is inherited (Python then installs no handler for it).
    return subprocess.Popen([sys.executable, "-m", "tiered_kv.ops.cli", "replay", "--quiet", *args], cwd=REPO,
                            env=clean_env(TMPDIR=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_until(condition: Callable[[], bool], process: subprocess.Popen, timeout: float = 100) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the replay ended (exit {process.returncode}) before the signal: {err[-2000:]}")
        assert time.monotonic() < deadline, "the replay did not get there in time"
        time.sleep(0.01)


def replay_dirs(tmp_path: Path) -> list[Path]:
    return list(tmp_path.glob("tiered-kv-replay-*"))


def test_sigterm_removes_the_temporary_l3_directory_and_exits_with_one_line(tmp_path):
    # The default chat (1,280 requests) runs for tens of seconds: the signal comes well before its end.
    process = start_replay(tmp_path)
    with process:
        wait_until(lambda: bool(replay_dirs(tmp_path)), process)
        time.sleep(0.5)  # into the run: pages stored on the L3 directory
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=100)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines() == ["tiered-kv: terminated"]
    assert out == ""
    assert replay_dirs(tmp_path) == [], "SIGTERM left the temporary L3 directory behind"


def _maps_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the torch import begin")
def test_ctrl_c_while_torch_loads_is_one_line_and_exit_130(tmp_path):
    process = start_replay(tmp_path)
    with process:
        # libtorch is mapped at the start of `import torch`; its Python half takes a while longer.
        wait_until(lambda: _maps_torch(process.pid), process)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=100)
    assert process.returncode == 130, err
    assert err.splitlines() == ["tiered-kv: interrupted"], err
    assert replay_dirs(tmp_path) == []
