"""The replay through the real hierarchy: hits on every tier, exact hits from block ids, --simulate
against a byte-moving run, malformed traces, the command line's output and exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tiered_kv.ops.cli import main
from tiered_kv.errors import ConfigError
from tiered_kv.ops.replay import build, embedded_default, read_trace, replay, summarize, synthetic_chat
from tiered_kv.ops.replay.cli import exit_code
from tiered_kv.ops.replay.report import format_table, hit_rate_series, plot

from ...backends.redis_server import REDIS_SERVER, RedisServer
from .conftest import (PAGE, TEST_SPEC, TINY_CHAT, TINY_TIERS, checked_replay, expected_hit_pages, run_cli, tier_flags,
                       trace_records, write_trace)

TRACE_TIERS = {"l1_pages": 24, "l2_pages": 40, "l3_pages": 512}


def _all_tiers_hit(s: dict) -> None:
    assert all(s["hit_tokens"][t] > 0 for t in ("l1", "l2", "l3")), s["hit_tokens"]
    assert s["pages_wrong"] == 0
    assert s["prefill_tokens_saved"] == sum(s["hit_tokens"].values())


def test_synthetic_chat_in_process_hits_every_tier_and_verifies_every_load():
    requests = synthetic_chat(TINY_CHAT)
    # One request at a time: with 8 in flight the L3 hits depend on how far the backups got (0-448
    # tokens on a loaded machine); one at a time gives the same hits on every run.
    s = checked_replay(requests, inflight=1, **TINY_TIERS)
    _all_tiers_hit(s)
    assert s["requests"] == len(requests)
    assert s["input_tokens"] == sum(r.input_length for r in requests)
    # Every page served by L2 or L3 was loaded onto L1 and compared with its oracle bytes.
    assert s["pages_verified"] == (s["hit_tokens"]["l2"] + s["hit_tokens"]["l3"]) // PAGE
    assert s["bytes"]["l2_to_l1"] > 0 and s["bytes"]["l3_to_l2"] > 0 and s["bytes"]["l2_to_l3"] > 0


def test_trace_in_process_hits_every_tier(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", trace_records(conversations=4, rounds=4))
    s = checked_replay(read_trace(path), inflight=1, **TRACE_TIERS)
    _all_tiers_hit(s)


@pytest.mark.parametrize("tiers, inflight", [
    ({"l1_pages": 4096, "l2_pages": 64, "l3_pages": 4096}, 8),  # L1 holds everything: overlap allowed
    ({"l1_pages": 48, "l2_pages": 512, "l3_pages": 4096}, 1),  # L1 evicts, L2 keeps
    ({"l1_pages": 48, "l2_pages": 96, "l3_pages": 4096}, 1),  # both evict, L3 keeps
])
def test_trace_hits_are_exactly_what_the_block_ids_imply(tmp_path, tiers, inflight):
    records = trace_records(conversations=3, rounds=4)
    path = write_trace(tmp_path / "t.jsonl", records)
    requests = read_trace(path)
    h = build(embedded_default(spec=TEST_SPEC, **tiers))
    try:
        result = replay(h, requests, inflight=inflight)
    finally:
        h.close()
    assert h.l2_free_slots == h.manager.num_slots and h.controller.pending_tasks() == 0
    h.release_memory()
    expected = expected_hit_pages(records)
    got = [r.l1_pages + r.l2_pages + r.l3_pages for r in result.requests]
    assert sum(expected) > 0
    assert got == expected
    assert sum(r.wrong_pages for r in result.requests) == 0


def test_simulate_and_byte_moving_replays_give_the_same_hits_per_tier(tmp_path):
    path = write_trace(tmp_path / "t.jsonl", trace_records(conversations=4, rounds=4))
    moved = checked_replay(read_trace(path), inflight=1, **TRACE_TIERS)
    simulated = checked_replay(read_trace(path), inflight=1, simulate=True, verify=False, **TRACE_TIERS)
    _all_tiers_hit(moved)
    assert simulated["simulate"] and not moved["simulate"]
    assert simulated["hit_tokens"] == moved["hit_tokens"]
    assert simulated["pages_verified"] == 0 and moved["pages_verified"] > 0
    assert simulated["bytes"]["l2_to_l1"] == 0  # nothing moved


def test_the_worker_side_in_a_child_process_gives_the_same_replay(tmp_path):
    """The composition root's two ways: scheduler and worker sides in one process, or the worker
    side (L1 and L2 memory, every move, the L3 controller) in a child; same hits, every load
    checked byte for byte there, the same bytes moved, every slot free and no task left after."""
    path = write_trace(tmp_path / "t.jsonl", trace_records(conversations=4, rounds=4))
    one = checked_replay(read_trace(path), **TRACE_TIERS)
    two = checked_replay(read_trace(path), worker_process=True, **TRACE_TIERS)
    _all_tiers_hit(two)
    assert two["hit_tokens"] == one["hit_tokens"]
    assert two["pages_verified"] == one["pages_verified"] > 0 and two["pages_wrong"] == 0
    assert two["bytes"] == one["bytes"]


def test_synthetic_simulate_matches_bytes_serially():
    requests = synthetic_chat(TINY_CHAT)
    moved = checked_replay(requests, inflight=1, **TINY_TIERS)
    simulated = checked_replay(synthetic_chat(TINY_CHAT), inflight=1, simulate=True, verify=False, **TINY_TIERS)
    assert simulated["hit_tokens"] == moved["hit_tokens"]


@pytest.mark.parametrize("workload", ["trace", "chat"])
def test_hits_per_tier_do_not_depend_on_timing_at_the_default_inflight(tmp_path, workload):
    """--simulate and a byte-moving replay give the same hits per tier, at the default
    flags (8 requests in flight) too, and the same on every run: the cache's decisions must not
    depend on which concurrent request's I/O happened to finish first. An L3 on memory:// (no disk
    I/O) and one on file:// (fsync per page) finish their I/O at very different times."""
    if workload == "trace":
        path = write_trace(tmp_path / "t.jsonl", trace_records(conversations=12, rounds=4))
        requests, tiers = (lambda: read_trace(path)), TRACE_TIERS
    else:
        requests, tiers = (lambda: synthetic_chat(TINY_CHAT)), {"l1_pages": 16, "l2_pages": 32, "l3_pages": 256}
    runs = [checked_replay(requests(), **tiers),
            checked_replay(requests(), l3_url=f"memory://?capacity_bytes={64 * 2**20}", **tiers),
            checked_replay(requests(), **tiers)]
    runs += [checked_replay(requests(), simulate=True, verify=False, **tiers) for _ in range(2)]
    assert all(not s["simulate"] for s in runs[:3]) and all(s["simulate"] for s in runs[3:])
    assert runs[0]["inflight"] == 8
    _all_tiers_hit(runs[0])
    assert [s["hit_tokens"] for s in runs] == [runs[0]["hit_tokens"]] * len(runs)


def test_wrong_bytes_on_l2_are_counted_and_exit_1():
    """Bytes changed on L2 behind the index's back are loaded onto L1 and caught by the oracle."""
    requests = synthetic_chat(TINY_CHAT)
    half = len(requests) // 2
    h = build(embedded_default(spec=TEST_SPEC, **TINY_TIERS))
    try:
        first = replay(h, requests[:half])
        resident = [h.manager.index.entry(k).slot for k in h.manager.index.lru_keys()]
        assert resident
        view = h.host_pool.chunk_view(0, 0)
        for slot in resident:
            view[slot, 0] ^= 0xFF
        second = replay(h, requests[half:])
    finally:
        h.close()
    assert h.l2_free_slots == h.manager.num_slots and h.controller.pending_tasks() == 0
    h.release_memory()
    assert summarize(first)["pages_wrong"] == 0
    s = summarize(second)
    assert s["pages_wrong"] > 0
    assert exit_code(s) == 1 and exit_code(summarize(first)) == 0
    assert "pages wrong" in format_table(s)


def test_hit_rate_series_adds_up_to_the_totals():
    s_result = None
    h = build(embedded_default(spec=TEST_SPEC, simulate=True, verify=False, **TINY_TIERS))
    try:
        s_result = replay(h, synthetic_chat(TINY_CHAT))
    finally:
        h.close()
    series = hit_rate_series(s_result, buckets=5)
    assert len(series["t"]) == 5
    for t in ("l1", "l2", "l3"):
        assert all(0.0 <= x <= 1.0 for x in series[t])
    assert any(series["l1"])


# --- malformed traces ------------------------------------------------------------------------------
GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}'


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "not JSON"),
    ('[1, 2]', "JSON object"),
    ('{"timestamp": 0, "input_length": 600}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 600, "hash_ids": [1]}', "needs 2 hash_ids"),
    ('{"timestamp": "soon", "input_length": 600, "hash_ids": [1, 2]}', "timestamp"),
    ('{"timestamp": 0, "input_length": -5, "hash_ids": []}', "input_length"),
    ('{"timestamp": 0, "input_length": 600, "hash_ids": [1, true]}', "hash_ids"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 1.5, "hash_ids": [1, 2]}', "output_length"),
])
def test_a_malformed_trace_line_is_an_error_naming_file_and_line(tmp_path, bad, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n\n{GOOD}\n{bad}\n{GOOD}\n")
    with pytest.raises(ConfigError, match=reason) as info:
        read_trace(path)
    assert f"{path}:4" in str(info.value)


def test_trace_slices(tmp_path):
    records = trace_records(conversations=3, rounds=4)  # 250 ms apart
    path = write_trace(tmp_path / "t.jsonl", records)
    assert len(read_trace(path)) == len(records)
    assert len(read_trace(path, limit=5)) == 5
    assert [r.arrival_s for r in read_trace(path, duration_s=1.0)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ConfigError, match="no requests"):
        read_trace(write_trace(tmp_path / "empty.jsonl", []))


# --- the command line ------------------------------------------------------------------------------
def test_cli_json_on_a_tiny_chat_hits_every_tier():
    spec = embedded_default().spec
    chat = ["--clients", str(TINY_CHAT.clients), "--rounds", str(TINY_CHAT.rounds),
            "--system-tokens", str(TINY_CHAT.system_tokens), "--turn-tokens", str(TINY_CHAT.turn_tokens),
            "--answer-tokens", str(TINY_CHAT.answer_tokens), "--rate", str(TINY_CHAT.rate), "--seed", str(TINY_CHAT.seed)]
    proc = run_cli("replay", "--json", *chat, *tier_flags(spec, **TINY_TIERS), "--inflight", "1")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    _all_tiers_hit(s)
    for key in ("requests", "input_tokens", "hit_tokens", "prefill_tokens_saved", "pages_verified", "pages_wrong"):
        assert key in s
    assert s["tier_pages"] == {"l1": TINY_TIERS["l1_pages"], "l2": TINY_TIERS["l2_pages"], "l3": TINY_TIERS["l3_pages"]}
    assert s["requests"] == TINY_CHAT.clients * TINY_CHAT.rounds and s["pages_verified"] > 0


def test_cli_trace_json_and_table(tmp_path):
    spec = embedded_default().spec
    path = write_trace(tmp_path / "t.jsonl", trace_records(conversations=4, rounds=4))
    flags = tier_flags(spec, **TRACE_TIERS)
    proc = run_cli("replay", "--json", "--trace", str(path), *flags, "--inflight", "1")
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    _all_tiers_hit(s)
    sim = run_cli("replay", "--trace", str(path), *flags, "--inflight", "1", "--simulate", "--limit", "8")
    assert sim.returncode == 0, sim.stderr
    assert "simulated" in sim.stdout and "hit rate" in sim.stdout and "8 requests" in sim.stdout


@pytest.mark.parametrize("args, message", [
    (["--limit", "3"], "give --trace too"),
    (["--clients", "0"], "--clients must be > 0, got 0"),
    (["--page-size", "32"], "give --model too"),
    (["--gpu-mem", "12XB"], "unknown unit"),
    (["--simulate", "--l3", "memory://"], "drop the L3 URL"),
    (["--model", "deepseek-v3.2", "--gpu-mem", "1MiB", "--simulate"], "--gpu-mem"),
    (["--config", "/nonexistent.yaml"], "/nonexistent.yaml"),
    (["--model", "deepseek-v3.2", "--layers", "62", "--simulate"], "--layers 62"),  # as plan refuses it
])
def test_cli_bad_usage_exits_2_with_one_line(args, message, capsys):
    # In process through the console script's own entry point (a subprocess each costs seconds).
    try:
        code = main(["replay", *args])
    except SystemExit as exc:  # argparse's own usage errors exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_malformed_trace_exits_2_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n{GOOD}\n{{oops\n")
    proc = run_cli("replay", "--simulate", "--trace", str(path))
    assert proc.returncode == 2
    assert f"{path}:3" in proc.stderr and "not JSON" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_plot_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    h = build(embedded_default(spec=TEST_SPEC, simulate=True, verify=False, **TINY_TIERS))
    try:
        result = replay(h, synthetic_chat(TINY_CHAT))
    finally:
        h.close()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the extra sees
    with pytest.raises(ConfigError, match=r"'plot' extra"):
        plot(result, str(tmp_path / "x.png"))
    assert not (tmp_path / "x.png").exists()


def test_cli_plot_writes_a_png(tmp_path):
    """--plot runs in the README's test install: matplotlib is in the ``test`` extra."""
    import tomllib

    extras = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"]
    assert any(dep.startswith("matplotlib") for dep in extras["optional-dependencies"]["test"])
    out = tmp_path / "hits.png"
    proc = run_cli("replay", "--simulate", "--quiet", "--clients", "4", "--rounds", "3", "--plot", str(out))
    assert proc.returncode == 0, proc.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_an_l3_that_is_unreachable_at_open_is_refused_at_once():
    """README: exit 1 for a failure found, a backend unreachable among them. An L3 nothing answers
    for ran the whole workload with its tier degraded; the build refuses it now, naming it."""
    import time

    from tiered_kv.errors import BackendUnavailableError

    from ...backends.redis_server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=f"{url} cannot be reached"):
        build(embedded_default(spec=TEST_SPEC, l3_url=url, **TINY_TIERS))
    assert time.monotonic() - started < 10


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_an_l3_that_goes_away_after_open_is_a_failure_found_exit_1():
    """README: exit 1 for a failure found, a backend unreachable among them. Gone after open, the
    tier is degraded, the replay runs on from L1 / L2 and exits 1."""
    from tiered_kv.hierarchy import Policies, PrefetchPolicy

    # No page reaches L3's write queue (admission after many hits), so the run ends at once; the
    # lookups still ask the dead server and put the tier in its degraded state.
    policies = Policies(prefetch=PrefetchPolicy.WAIT_COMPLETE, l3_admission_hits=1000)
    with RedisServer() as server:
        s = checked_replay(synthetic_chat(TINY_CHAT), l3_url=server.url, policies=policies, after_build=server.kill,
                           **TINY_TIERS)
    assert s["pages_wrong"] == 0 and s["l3_degraded_episodes"] >= 1
    assert exit_code(s) == 1


def test_host_mem_below_one_controller_batch_is_refused_as_the_config_refuses_it(capsys):
    """``l2.size`` below one controller batch is refused by the config; ``--host-mem`` took it."""
    from tiered_kv.ops.plan import slot_bytes

    spec = embedded_default().spec
    code = main(["replay", "--simulate", "--quiet", "--host-mem", str(8 * slot_bytes(spec))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--host-mem" in err and "fewer than one controller batch" in err
    assert len(err.strip().splitlines()) == 1


def test_prefetch_default_is_what_the_help_says(tmp_path, monkeypatch, capsys):
    """--help's default for --prefetch is the one that applies: the config's policies.prefetch
    (best_effort when the file leaves it out), wait_complete without a file; the flag wins."""
    from tiered_kv.ops.cli import build_parser
    from tiered_kv.ops.replay.cli import settings_from_args

    monkeypatch.delenv("TIERED_KV_CONFIG", raising=False)
    path = tmp_path / "kv.yaml"
    path.write_text("spec: {kind: nsa, layers: 2}\nl1: {size: 16MiB}\nl2: {size: 48MiB}\nl3: {size: 1GiB}\n")
    parser = build_parser()
    prefetch = lambda *argv: settings_from_args(parser.parse_args(["replay", *argv])).policies.prefetch.value
    assert prefetch("--config", str(path)) == "best_effort"
    assert prefetch() == "wait_complete"
    assert prefetch("--config", str(path), "--prefetch", "timeout") == "timeout"
    with pytest.raises(SystemExit):
        parser.parse_args(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: the config's policies.prefetch; without a config file wait_complete" in text
    assert "default wait_complete)" not in text


@pytest.mark.parametrize("blocks", [4, 8])
@pytest.mark.parametrize("simulate", [False, True])
def test_a_repeated_round_of_prompts_hits_whole_at_the_default_inflight(tmp_path, blocks, simulate):
    """Eight prompts, then the same eight again, at the embedded default's tiers and the default
    eight requests in flight. Four blocks a prompt: a step of eight holds more pages than L1 (a
    step admits only what L1 holds, as an engine's batch). Eight blocks: the round does not fit
    L2, and a step's earlier prefetches evict a later request's matched L2 pages (which its
    prefetch reads back from L3). Either way the second round hits every page."""
    trace = tmp_path / "rounds.jsonl"
    with trace.open("w") as f:
        for i in range(16):
            prompt = i % 8 + 1
            ids = [prompt * 100 + j for j in range(blocks)]
            f.write(json.dumps({"timestamp": 10 * i, "input_length": 512 * blocks, "output_length": 1,
                                "hash_ids": ids}) + "\n")
    # The embedded default's tiers (L1 160, L2 448 pages); every slot freed, no task left.
    result = checked_replay(read_trace(trace), simulate=simulate)
    assert sum(result["hit_tokens"].values()) == 8 * 512 * blocks  # the whole second round
    assert result["pages_wrong"] == 0
