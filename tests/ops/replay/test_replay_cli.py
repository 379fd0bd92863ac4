"""``tiered-kv replay``'s command line around the run: ``--plot`` checked before any work and drawn
without inventing 0% where nothing arrived, progress where stderr is no terminal, and
``--latent-dtype`` as ``plan`` has it."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from tiered_kv.ops.cli import build_parser, main
from tiered_kv.ops.replay import build, embedded_default, read_trace, replay
from tiered_kv.ops.replay import cli as replay_cli
from tiered_kv.ops.replay.report import hit_rate_series, plot
from tiered_kv.model.spec import model_spec

from .conftest import TEST_SPEC, TINY_TIERS, trace_records, write_trace

SMALL_SIMULATED = ["--simulate", "--clients", "3", "--rounds", "2"]


def call(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def no_config_from_the_environment(monkeypatch):
    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)


# --- --plot to a path that cannot be written: refused first ----------------------------------------
@pytest.mark.parametrize("where, reason", [("missing/hits.png", "No such file or directory"),
                                           (".", "Is a directory")])
def test_an_unwritable_plot_path_is_refused_before_any_work(where, reason, tmp_path, monkeypatch, capsys):
    def no_build(settings):
        raise AssertionError("the hierarchy was built before --plot was checked")

    monkeypatch.setattr(replay_cli, "build", no_build)
    target = tmp_path / where
    # A trace that does not exist either: the --plot check comes before the workload is read.
    code, out, err = call(["replay", "--trace", str(tmp_path / "no-trace.jsonl"), "--plot", str(target)], capsys)
    assert code == 2, err
    assert err.splitlines() == [f"tiered-kv: error: --plot {target}: cannot write ({reason})"]
    assert out == ""


def test_a_writable_plot_path_is_left_as_it_was_when_the_run_is_refused(tmp_path, capsys):
    new, old = tmp_path / "new.png", tmp_path / "old.png"
    old.write_bytes(b"an earlier picture")
    for target in (new, old):
        code, _, err = call(["replay", "--trace", str(tmp_path / "no-trace.jsonl"), "--plot", str(target)], capsys)
        assert code == 2 and "no-trace.jsonl" in err
    assert not new.exists(), "the writability check left an empty file"
    assert old.read_bytes() == b"an earlier picture"


# --- the picture: windows without input are gaps ----------------------------------------------------
def _gap_result(tmp_path):
    """A simulated replay of a trace whose requests arrive in two bursts 20 s apart."""
    records = trace_records(conversations=3, rounds=4)
    for r in records[len(records) // 2:]:
        r["timestamp"] += 20_000
    h = build(embedded_default(spec=TEST_SPEC, simulate=True, verify=False, **TINY_TIERS))
    try:
        return replay(h, read_trace(write_trace(tmp_path / "gap.jsonl", records)), inflight=1)
    finally:
        h.close()


def test_windows_without_input_have_no_hit_rate(tmp_path):
    series = hit_rate_series(_gap_result(tmp_path), buckets=10)
    for tier in ("l1", "l2", "l3"):
        assert all(math.isnan(x) for x in series[tier][1:-1]), (tier, series[tier])
        assert not math.isnan(series[tier][0]) and not math.isnan(series[tier][-1])
    assert series["l1"][-1] > 0  # the second burst repeats the first one's prefixes
    assert series["width"] == pytest.approx((series["t"][1] - series["t"][0]))


def test_the_plot_draws_only_windows_with_input(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    result = _gap_result(tmp_path)
    series = hit_rate_series(result)
    filled = [t for t, rate in zip(series["t"], series["l1"]) if not math.isnan(rate)]
    assert len(filled) < len(series["t"])
    drawn: list[float] = []
    real_bar = Axes.bar

    def bar(self, x, *args, **kwargs):
        drawn.extend(float(v) for v in x)
        return real_bar(self, x, *args, **kwargs)

    monkeypatch.setattr(Axes, "bar", bar)
    out = tmp_path / "hits.png"
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(drawn) == sorted(filled * 3)  # one bar per tier in each window with input, none elsewhere


# --- progress where stderr is no terminal ------------------------------------------------------------
def test_progress_is_a_plain_line_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(replay_cli, "PROGRESS_EVERY_S", 0.0)  # a line for every request
    code, out, err = call(["replay", *SMALL_SIMULATED, "--json"], capsys)
    assert code == 0, err
    lines = err.splitlines()
    assert len(lines) == 6, lines
    for i, line in enumerate(lines, 1):
        head, _, seconds = line.rpartition(", ")
        assert head == f"replay: {i}/6 requests" and seconds.endswith(" s") and float(seconds[:-2]) >= 0
    assert json.loads(out)["requests"] == 6


def test_quiet_prints_no_progress(monkeypatch, capsys):
    monkeypatch.setattr(replay_cli, "PROGRESS_EVERY_S", 0.0)
    code, out, err = call(["replay", *SMALL_SIMULATED, "--json", "--quiet"], capsys)
    assert code == 0 and err == ""


# --- --latent-dtype, as plan has it ------------------------------------------------------------------
def _choices(parser: argparse.ArgumentParser, command: str) -> list[str]:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = commands.choices[command]
    return next(a for a in sub._actions if "--latent-dtype" in a.option_strings).choices


def test_replay_takes_latent_dtype_with_the_choices_plan_has(capsys):
    parser = build_parser()
    assert _choices(parser, "replay") == _choices(parser, "plan")
    code, out, err = call(["replay", *SMALL_SIMULATED, "--json", "--quiet", "--model", "deepseek-v3.2", "--layers", "2",
                           "--latent-dtype", "bf16"], capsys)
    assert code == 0, err
    bf16 = model_spec("deepseek-v3.2", latent_dtype="bf16", layer_range=(0, 2))
    assert json.loads(out)["spec"] == bf16.describe()
    assert bf16.describe() != model_spec("deepseek-v3.2", layer_range=(0, 2)).describe()


@pytest.mark.parametrize("argv, message", [
    (["--model", "deepseek-v3", "--latent-dtype", "fp8"], "--latent-dtype fp8: deepseek-v3 (mla) stores its latent only as bf16"),
    (["--model", "llama-3.1-8b", "--latent-dtype", "bf16"], "--latent-dtype bf16: llama-3.1-8b (mha) has no latent"),
    (["--latent-dtype", "bf16"], "give --model too"),
])
def test_a_latent_dtype_the_model_does_not_store_is_refused_as_plan_refuses_it(argv, message, capsys):
    code, out, err = call(["replay", *SMALL_SIMULATED, *argv], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err, err
    if argv[0] == "--model":
        plan_code, _, plan_err = call(["plan", *argv], capsys)
        assert plan_code == 2 and message in plan_err
