"""``tiered-kv bench storage`` end to end on small runs (the numbers themselves live in docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from tiered_kv.cli import main


@pytest.mark.parametrize("url", ["memory://?capacity_bytes=256MiB", "file://{tmp}/kv"])
def test_bench_storage_json(url, tmp_path, capsys):
    assert main(["bench", "storage", "--backend", url.format(tmp=tmp_path), "--pages", "4", "--batch", "2",
                 "--repeat", "1", "--warmup", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("put_gbps", "get_gbps", "get_warm_gbps"):
        assert result[key] > 0
    assert result["pages"] == 4 and result["record_bytes"] == 4096 + 3_076_352
    if url.startswith("file"):
        assert result["raw_put_gbps"] > 0 and result["raw_get_gbps"] > 0
        assert result["put_vs_raw"] == pytest.approx(result["put_gbps"] / result["raw_put_gbps"])
        assert list((tmp_path / "kv").rglob("*.page")) == []  # the benchmark cleans up its pages
    else:
        assert "raw_put_gbps" not in result


def test_bench_storage_table(tmp_path, capsys):
    assert main(["bench", "storage", "--backend", f"file://{tmp_path}", "--pages", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "put GB/s" in out and "raw" in out and "ratio" in out


def test_bench_storage_bad_url_exits_2(capsys):
    assert main(["bench", "storage", "--backend", "nosuch://x", "--pages", "1", "--repeat", "1"]) == 2
    assert "unknown backend scheme" in capsys.readouterr().err
