"""``tiered-kv plan`` and size parsing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tiered_kv.ops.cli import main
from tiered_kv.errors import ConfigError
from tiered_kv.model.sizes import parse_size


@pytest.mark.parametrize(
    "text, expected",
    [("64GiB", 64 * 2**30), ("1.5TB", 1_500_000_000_000), ("4096", 4096), ("512 MiB", 512 * 2**20), ("2g", 2 * 2**30), (7, 7)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "1.2.3GB", "12XB", "-5GB", "five"])
def test_malformed_sizes(text):
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


def test_plan_json_deepseek(capsys):
    assert main(["plan", "--model", "deepseek-v3.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_per_token"] == 48_068
    assert out["page_bytes"] == 3_076_352
    for tier in ("gpu", "host", "disk"):
        assert out[tier]["tokens"] == out[tier]["pages"] * 64


def test_plan_tiers_follow_sizes(capsys):
    assert main(["plan", "--json", "--gpu-mem", "30GB", "--host-mem", "1TiB", "--disk", "1.5TB", "--layers", "30",
                 "--page-size", "32", "--latent-dtype", "bf16"]) == 0
    out = json.loads(capsys.readouterr().out)
    page = 30 * (32 * 1_152 + 32 * 132)
    assert out["page_bytes"] == page
    assert out["gpu"]["pages"] == 30_000_000_000 // page
    stored = -(-(4096 + page) // 4096) * 4096
    assert out["host"]["pages"] == 2**40 // stored
    assert out["disk"]["pages"] == 1_500_000_000_000 // stored


def test_plan_table_output(capsys):
    assert main(["plan"]) == 0
    text = capsys.readouterr().out
    assert "48,068 B" in text and "page payload 3,076,352 B" in text


def test_malformed_size_exits_2():
    result = subprocess.run([sys.executable, "-m", "tiered_kv.ops.cli", "plan", "--disk", "1.5XB"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "--disk" in result.stderr and "1.5XB" in result.stderr


@pytest.mark.parametrize("argv", [["plan", "--layers", "0"], ["plan", "--model", "nope"], ["plan", "--page-size", "x"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def _write_trace(path, requests) -> None:
    with open(path, "w") as f:
        for i, ids in enumerate(requests):
            f.write(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids}) + "\n")


def test_plan_trace_gives_the_hits_the_block_ids_imply(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    _write_trace(trace, [[1, 2], [1, 2, 3], [4], [1, 2, 3, 5]])
    assert main(["plan", "--model", "deepseek-v3.2", "--trace", str(trace), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["trace"]
    # Tiers far larger than the trace: every repeated leading block is an L1 hit.
    assert out["requests"] == 4 and out["input_tokens"] == 512 * 10
    assert out["hit_tokens"] == {"l1": 512 * (2 + 3), "l2": 0, "l3": 0}
    assert out["tier_pages"]["l1"] > 0
    # A GPU too small for a request's pages moves the hits down the tiers, the total stays.
    assert main(["plan", "--model", "deepseek-v3.2", "--trace", str(trace), "--gpu-mem", "16GiB", "--layers", "61",
                 "--json"]) == 0
    small = json.loads(capsys.readouterr().out)["trace"]
    assert sum(small["hit_tokens"].values()) <= 512 * 5


def test_plan_trace_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10}\n')
    assert main(["plan", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1:" in err and "hash_ids" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--limit", "3"]) == 2
    assert "--limit" in capsys.readouterr().err
