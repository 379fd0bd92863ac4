"""The ``tiered-kv`` command line as a user meets it: exit codes, one-line errors, no tracebacks.

Most tests run the CLI as a subprocess (``python -m tiered_kv.ops.cli``, and the console script once);
the argument-value matrix calls ``main`` in-process (the same code path, much faster on 2 cores).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tiered_kv
from tiered_kv.ops import cli as cli
from tiered_kv.model.host_pool import HostPool
from tiered_kv.model.spec import model_spec, nsa_spec

from ..backends.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    command = [script] if script else [sys.executable, "-m", "tiered_kv.ops.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (exit code, stdout, stderr), whether argparse exits or main returns."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *needles: str) -> None:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith("tiered-kv"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# --- the bare command, --version, the console script --------------------------------------------
def test_no_command_prints_the_help_and_exits_2():
    result = run_cli()
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: tiered-kv")
    for name in cli.COMMANDS:
        assert re.search(rf"^\s+{re.escape(name)}\s+\S", result.stderr, re.M), f"help does not describe {name!r}"
    assert "exit codes" in result.stderr and "Traceback" not in result.stderr


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"tiered-kv {tiered_kv.__version__}\n"
    try:
        installed = importlib.metadata.version("tiered-kv")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tiered-kv is not installed; only the module's version is checked")
    assert installed == tiered_kv.__version__, "pyproject's version and tiered_kv.__version__ disagree"


def test_console_script_runs_plan():
    script = Path(sys.executable).with_name("tiered-kv")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable} (package not installed there)")
    result = run_cli("plan", "--json", script=str(script))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["page_bytes"] == nsa_spec().page_bytes


# --- runtime failures: exit 1, one line, traceback only with --debug ------------------------------
def test_unreachable_backend_exits_1_with_one_line():
    port = free_port()  # nothing listens there
    result = run_cli("bench", "storage", "--backend", f"redis://127.0.0.1:{port}", "--pages", "1", "--repeat", "1",
                     "--warmup", "0", "--no-raw")
    assert result.returncode == 1
    assert_one_line_error(result.stderr, f"127.0.0.1:{port}")
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("url", ["memory://?capacity_bytes=1MiB", "file://{tmp}/kv?capacity_bytes=1MiB"])
def test_store_too_small_exits_1_with_one_line(url, tmp_path, capsys):
    code, out, err = call(["bench", "storage", "--backend", url.format(tmp=tmp_path), "--pages", "2", "--repeat", "1",
                           "--warmup", "0", "--no-raw"], capsys)
    assert code == 1
    assert_one_line_error(err, "stored only 0 of 2 pages", "large enough")
    assert not (tmp_path / "kv").exists() or not any((tmp_path / "kv").iterdir())


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_prints_the_traceback(where):
    args = ["bench", "storage", "--backend", "memory://?capacity_bytes=1MiB", "--pages", "1", "--repeat", "1", "--warmup", "0"]
    args = ["--debug", *args] if where == "before" else [*args, "--debug"]
    result = run_cli(*args)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "BackendError" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("tiered-kv: error: memory backend stored only 0 of 1")


def test_a_reader_that_goes_away_is_no_internal_error():
    # `tiered-kv config show | head -1`: a closed pipe is the reader's choice, not "internal error: BrokenPipeError".
    process = subprocess.Popen([sys.executable, "-m", "tiered_kv.ops.cli", "config", "show"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with process:
        process.stdout.close()  # before the command writes: its first write meets a closed pipe
        err = process.stderr.read()
        assert process.wait(timeout=120) == 1
    assert err == ""


def _boom_arguments(p, common):
    # A command with a bug in it: what the CLI does with an exception that is not the library's.
    def boom(args):
        return {}["missing key"]

    p.set_defaults(func=boom)


def test_a_bug_is_one_line_with_a_hint(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "boom", cli.Command("a command with a bug", _boom_arguments))
    code, out, err = call(["boom"], capsys)
    assert code == 1
    assert_one_line_error(err, "internal error", "KeyError", "missing key", "--debug")
    code, out, err = call(["boom", "--debug"], capsys)
    assert code == 1
    assert "Traceback" in err and err.splitlines()[-1].startswith("tiered-kv: internal error: KeyError")


# --- bad argument values: exit 2, one line naming the argument -----------------------------------
@pytest.mark.parametrize("argv, named", [
    (["plan", "--model", "llama-3.1-8b", "--latent-dtype", "fp8"], "--latent-dtype"),
    (["plan", "--model", "llama-3.1-70b", "--latent-dtype", "bf16"], "--latent-dtype"),
    (["plan", "--model", "deepseek-v3", "--latent-dtype", "fp8"], "--latent-dtype"),
    (["plan", "--layers", "62"], "--layers"),
    (["plan", "--model", "llama-3.1-8b", "--layers", "33"], "--layers"),
    (["plan", "--layers", "0"], "--layers"),
    (["plan", "--layers", "-4"], "--layers"),
    (["plan", "--layer-range", "60:62"], "--layer-range"),
    (["plan", "--layer-range", "61:62"], "--layer-range"),
    (["plan", "--layer-range", "5:5"], "--layer-range"),
    (["plan", "--layer-range", "7:3"], "--layer-range"),
    (["plan", "--layer-range=-1:3"], "--layer-range"),
    (["plan", "--layer-range", "3"], "--layer-range"),
    (["plan", "--layers", "3", "--layer-range", "0:3"], "--layer-range"),
    (["plan", "--page-size", "0"], "--page-size"),
    (["plan", "--page-size=-64"], "--page-size"),
    (["plan", "--gpu-mem", "0"], "--gpu-mem"),
    (["plan", "--host-mem", "0GiB"], "--host-mem"),
    (["plan", "--disk=-5GB"], "--disk"),
    (["plan", "--disk", "1.5XB"], "--disk"),
    (["plan", "--gpu-mem", "1MiB"], "--gpu-mem"),  # less than one page
    (["plan", "--model", "nope"], "--model"),
    (["bench", "storage", "--backend", "memory://", "--pages", "0"], "--pages"),
    (["bench", "storage", "--backend", "memory://", "--batch", "0"], "--batch"),
    (["bench", "storage", "--backend", "memory://", "--repeat", "0"], "--repeat"),
    (["bench", "storage", "--backend", "memory://", "--warmup=-1"], "--warmup"),
    (["bench", "storage", "--backend", "nosuch://x", "--pages", "1"], "nosuch"),
    (["bench", "storage", "--backend", "file://relative/dir", "--pages", "1"], "file"),
    # URLs urllib refuses and a NUL byte in a file path: the backends' ConfigError, never a bare ValueError
    (["bench", "storage", "--backend", "redis://[::1", "--pages", "1"], "bad host part"),
    (["bench", "storage", "--backend", "file:///tmp/a%00b", "--pages", "1"], "NUL byte"),
    (["inspect", "redis://[::1"], "bad host part"),
    (["inspect", "file:///tmp/a%00b"], "NUL byte"),
    (["bench", "storage"], "--backend"),
    (["bench"], "storage"),
    (["frobnicate"], "frobnicate"),
])
def test_bad_argument_values_exit_2_with_one_line(argv, named, capsys):
    code, out, err = call(argv, capsys)
    assert code == 2
    assert_one_line_error(err, named)
    assert out == ""


@pytest.mark.parametrize("argv, message", [
    (["plan", "--gpu-mem", "-3GiB"], "--gpu-mem must be > 0, got -3GiB"),
    (["plan", "--host-mem=-1MiB"], "--host-mem must be > 0, got -1MiB"),
    (["plan", "--disk", "0"], "--disk must be > 0, got 0"),
    (["plan", "--page-size", "-64"], "--page-size must be > 0, got -64"),
    (["plan", "--layers", "0"], "--layers must be > 0, got 0"),
    (["replay", "--clients", "-3"], "--clients must be > 0, got -3"),
    (["replay", "--rate", "-0.5"], "--rate must be > 0 and finite, got -0.5"),
    (["replay", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["replay", "--host-mem", "-48MiB"], "--host-mem must be > 0, got -48MiB"),
    (["bench", "storage", "--backend", "memory://", "--pages", "-2"], "--pages must be > 0, got -2"),
])
def test_sizes_and_counts_out_of_range_say_so_naming_the_flag(argv, message, capsys):
    """Not "malformed size" for ``-3GiB``, nor "expected one argument" where argparse took the
    value for an option."""
    code, out, err = call(argv, capsys)
    assert code == 2
    assert_one_line_error(err, message)
    assert "malformed" not in err and "expected one argument" not in err and "argument --" not in err


def test_text_that_is_no_number_still_says_what_was_expected(capsys):
    code, _, err = call(["replay", "--clients", "many"], capsys)
    assert code == 2
    assert_one_line_error(err, "--clients", "expected an integer, got 'many'")


# --- plan: valid combinations and the page-size words --------------------------------------------
def test_layer_range_and_layers_pick_the_model_layers(capsys):
    code, out, _ = call(["plan", "--json", "--layer-range", "30:61"], capsys)
    assert code == 0
    stage = json.loads(out)
    per_layer = nsa_spec().page_bytes // 61
    assert stage["layers"] == 31 and stage["page_bytes"] == 31 * per_layer
    code, out, _ = call(["plan", "--json", "--layers", "30"], capsys)
    first = json.loads(out)
    assert first["layers"] == 30 and first["page_bytes"] == 30 * per_layer
    assert first["fingerprint"] != stage["fingerprint"]
    code, out, _ = call(["plan", "--json", "--model", "deepseek-v3", "--latent-dtype", "bf16"], capsys)
    assert code == 0 and json.loads(out)["page_bytes"] == model_spec("deepseek-v3").page_bytes


def test_plan_sizes_are_the_pools_sizes(capsys):
    """record_bytes and slot_bytes in the plan are what a real host pool of the spec uses."""
    code, out, _ = call(["plan", "--json", "--layers", "4", "--page-size", "16"], capsys)
    assert code == 0
    plan = json.loads(out)
    with HostPool(model_spec("deepseek-v3.2", page_size=16, layer_range=(0, 4)), 1) as pool:
        assert plan["record_bytes"] == pool.record_bytes
        assert plan["slot_bytes"] == pool.slot_bytes == plan["stored_page_bytes"]
    assert plan["tiers"]["host"]["pages"] == plan["tiers"]["host"]["capacity_bytes"] // pool.slot_bytes
    assert plan["tiers"]["gpu"]["bytes_per_page"] == plan["page_bytes"]


def _sizes_line(text: str) -> str:
    lines = [line for line in text.splitlines() if re.search(r"page payload \d", line)]
    assert len(lines) == 1, text
    return lines[0][lines[0].index("page payload"):]


def test_plan_and_bench_name_page_sizes_the_same(tmp_path, capsys):
    spec = nsa_spec()
    record = 4096 + spec.page_bytes
    slot = -(-record // 4096) * 4096
    code, plan_out, _ = call(["plan"], capsys)
    assert code == 0
    words = _sizes_line(plan_out)
    assert f"page payload {spec.page_bytes:,} B" in words
    assert f"stored record {record:,} B (payload + 4 KiB header)" in words
    assert f"padded slot {slot:,} B" in words
    code, bench_out, err = call(["bench", "storage", "--backend", f"file://{tmp_path}/kv", "--pages", "2", "--repeat", "1",
                                 "--warmup", "0"], capsys)
    assert code == 0, err
    assert _sizes_line(bench_out) == words
    assert f"GB/s count stored records: 2 x {record:,} B" in bench_out
    ratio = [line for line in bench_out.splitlines() if "ratio" in line]
    assert len(ratio) == 1 and ratio[0].startswith("per-round ratio") and "median of 1" in ratio[0]


# --- bench storage leaves no empty directories -----------------------------------------------------
def test_bench_storage_removes_the_directories_it_made(tmp_path, capsys):
    code, _, err = call(["bench", "storage", "--backend", f"file://{tmp_path}/new/kv", "--pages", "3", "--repeat", "1",
                         "--warmup", "0"], capsys)
    assert code == 0, err
    assert list(tmp_path.iterdir()) == []


def test_bench_storage_keeps_what_was_there(tmp_path, capsys):
    root = tmp_path / "kv"
    (root / "mine").mkdir(parents=True)  # an empty directory of the user's: not the benchmark's to remove
    (root / "notes.txt").write_text("kept")
    code, _, err = call(["bench", "storage", "--backend", f"file://{root}", "--pages", "3", "--repeat", "1", "--warmup", "0"],
                        capsys)
    assert code == 0, err
    assert sorted(p.name for p in root.iterdir()) == ["mine", "notes.txt"]


@pytest.mark.parametrize("argv", [["--pages", "99999999999"], ["--page-size", "99999999", "--layers", "1"]])
def test_bench_transfer_pools_too_large_to_allocate_are_bad_input(argv, capsys):
    """More pages than the device can hold is an impossible argument (exit 2, one line naming the
    flags), not an "internal error ... (a bug)" from the allocator (exit 1)."""
    assert cli.main(["bench", "transfer", "--device", "cpu", "--warmup", "0", "--repeat", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err
    assert "--pages" in err and "does not fit" in err


# --- an extra that is not installed: exit 1, one line naming it ---------------------------------
def run_cli_without(module: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess where ``import module`` fails, as on an install without its extra."""
    code = f"import sys; sys.modules[{module!r}] = None; from tiered_kv.ops.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("argv", [
    ["replay", "--quiet", "--json", "--l3", "redis://127.0.0.1:{port}/0"],
    ["bench", "storage", "--backend", "unix:///tmp/no-such-redis.sock", "--pages", "1", "--repeat", "1", "--warmup", "0"],
    ["inspect", "rediss://127.0.0.1:{port}/0"],
    ["config", "check", str(REPO / "examples" / "configs" / "redis.yaml")],
], ids=["replay", "bench", "inspect", "config-check"])
def test_redis_without_the_redis_extra_names_the_extra(argv):
    # It ended in "internal error: ModuleNotFoundError ... (a bug)", and config check said ok.
    result = run_cli_without("redis", *(a.format(port=free_port()) for a in argv))
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, "pip install 'tiered-kv[redis]'")
    assert "internal error" not in result.stderr


# --- an L3 that cannot serve at open: exit 1 at once, one line naming it --------------------------
@pytest.mark.parametrize("o_direct", ["true", "false"])
def test_replay_on_a_read_only_l3_directory_exits_1_with_one_line(tmp_path, o_direct):
    # It ended in "internal error: OSError" (the O_DIRECT probe's cleanup), or with o_direct=false
    # ran the whole workload with its tier degraded and back again, storing nothing.
    from ..backends.unwritable import read_only

    root = tmp_path / "kv"
    root.mkdir()
    with read_only(root):
        result = run_cli("replay", "--quiet", "--json", "--l3", f"file://{root}?o_direct={o_direct}")
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, str(root), "cannot be written")
    assert result.stdout == ""


def test_replay_on_an_unreachable_redis_exits_1_at_once_with_one_line():
    # It ran the whole workload with the tier degraded and exited 1 minutes later, and with --json
    # nothing on stderr said why.
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = run_cli("replay", "--quiet", "--json", "--l3", f"redis://127.0.0.1:{port}/0")
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result.stderr, f"redis://127.0.0.1:{port}/0", "cannot be reached")
    assert result.stdout == ""
    assert time.monotonic() - started < 30
