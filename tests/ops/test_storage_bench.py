"""``tiered-kv bench storage`` end to end on small runs (the numbers themselves live in docs/benchmarks.md)."""

from __future__ import annotations

import json
import statistics

import pytest

from tiered_kv.ops.cli import main


@pytest.mark.parametrize("url", ["memory://?capacity_bytes=256MiB", "file://{tmp}/kv"])
def test_bench_storage_json(url, tmp_path, capsys):
    assert main(["bench", "storage", "--backend", url.format(tmp=tmp_path), "--pages", "4", "--batch", "2",
                 "--repeat", "1", "--warmup", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("put_gbps", "get_gbps", "get_warm_gbps"):
        assert result[key] > 0
    assert result["pages"] == 4 and result["record_bytes"] == 4096 + 3_076_352
    # Every medium has its raw ceiling in the same run (memory's: a plain memcpy each way).
    assert result["raw_put_gbps"] > 0 and result["raw_get_gbps"] > 0
    assert result["put_vs_raw"] == pytest.approx(result["put_gbps"] / result["raw_put_gbps"])
    assert result["backend"] == url.format(tmp=tmp_path).split("?")[0]
    if url.startswith("file"):
        assert list((tmp_path / "kv").rglob("*.page")) == []  # the benchmark cleans up its pages
    else:
        assert "memcpy" in result["raw_method"]


@pytest.mark.parametrize("url", ["memory://", "memory://?capacity_bytes=256MiB#frag", "file:///x/y?workers=2"])
def test_shown_url_keeps_what_the_user_wrote_less_options(url):
    from tiered_kv.ops.bench.storage import shown_url

    assert shown_url(url) == url.split("#")[0].split("?")[0]
    assert shown_url("memory://") == "memory://"  # urllib's round trip would give "memory:"


def test_bench_storage_no_raw_leaves_the_ceiling_out(capsys):
    assert main(["bench", "storage", "--backend", "memory://", "--pages", "2", "--repeat", "1", "--warmup", "0",
                 "--no-raw", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "raw_put_gbps" not in result and result["backend"] == "memory://"


def test_bench_storage_table(tmp_path, capsys):
    assert main(["bench", "storage", "--backend", f"file://{tmp_path}", "--pages", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "put GB/s" in out and "raw" in out and "ratio" in out


def test_bench_storage_bad_url_exits_2(capsys):
    assert main(["bench", "storage", "--backend", "nosuch://x", "--pages", "1", "--repeat", "1"]) == 2
    assert "unknown backend scheme" in capsys.readouterr().err


def test_same_pages_ceiling_is_used_and_alternates_with_ours(monkeypatch, capsys):
    """A backend that can run the medium's own calls on the round's slots: the ratios use that
    ceiling, and rounds alternate which side goes first."""
    from tiered_kv.backends.memory import MemoryBackend
    from tiered_kv.ops.bench import raw_ceilings

    events: list[str] = []
    real_put = MemoryBackend.put_from

    async def put_from(self, keys, slots):
        events.append("ours")
        return await real_put(self, keys, slots)

    async def raw_round(backend, src_slots, dst_slots, *, batch):
        assert isinstance(backend, MemoryBackend)
        assert len(src_slots) == len(dst_slots) == 4 and batch == 2
        events.append("raw")
        return {"raw_put_s": 0.5, "raw_get_s": 0.25}

    monkeypatch.setattr(MemoryBackend, "put_from", put_from)
    monkeypatch.setitem(raw_ceilings.SAME_PAGE_ROUNDS, "memory", raw_round)
    assert main(["bench", "storage", "--backend", "memory://?capacity_bytes=256MiB", "--pages", "4", "--batch", "2",
                 "--repeat", "2", "--warmup", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    total = 4 * result["record_bytes"]
    assert result["raw_put_gbps"] == pytest.approx(total / 0.5 / 1e9)
    assert result["raw_get_gbps"] == pytest.approx(total / 0.25 / 1e9)
    assert result["put_vs_raw"] == pytest.approx(statistics.median(r["put_gbps"] for r in result["rounds"]) / result["raw_put_gbps"])
    assert "own client" in result["raw_method"]
    # Round 0: ours (two batches of 2) then raw; round 1: raw first.
    assert events == ["ours", "ours", "raw", "raw", "ours", "ours"]
