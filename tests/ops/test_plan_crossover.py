"""``tiered-kv plan --prefill-tokens-per-s``: the read bandwidth above which a tier's hit beats recomputing."""

from __future__ import annotations

import json

import pytest

from tiered_kv.ops.cli import main
from tiered_kv.ops.plan import crossovers, slot_bytes
from tiered_kv.model.spec import model_spec


def test_crossover_is_bytes_per_token_times_the_prefill_rate():
    spec = model_spec("llama-3.1-8b")
    host, disk = crossovers(spec, 20_000, host_gbps=50.0, disk_gbps=1.2)
    assert host.bytes_per_token == 131_072  # 32 layers x (k + v) x 8 heads x 128 x 2 B
    assert host.crossover_gbps == pytest.approx(131_072 * 20_000 / 1e9)
    assert disk.bytes_per_token == slot_bytes(spec) / 64
    assert host.beats_recompute is True and disk.beats_recompute is False
    assert disk.load_s_per_1k_tokens == pytest.approx(1000 * disk.bytes_per_token / 1.2e9)


def test_plan_json_reports_the_crossover(capsys):
    assert main(["plan", "--model", "deepseek-v3.2", "--prefill-tokens-per-s", "50000", "--disk-gbps", "1.2",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["crossover"]
    disk = out["tiers"]["disk"]
    assert disk["crossover_gbps"] == pytest.approx(slot_bytes(model_spec("deepseek-v3.2")) / 64 * 50_000 / 1e9)
    assert disk["beats_recompute"] is False and out["tiers"]["host"]["gbps"] is None


def test_plan_table_prints_the_verdict(capsys):
    assert main(["plan", "--model", "llama-3.1-8b", "--prefill-tokens-per-s", "25000", "--host-gbps", "50",
                 "--disk-gbps", "1.2"]) == 0
    text = capsys.readouterr().out
    assert "host      3.28 GB/s" in text and "beats recompute (15.26x)" in text
    assert "slower than recompute (0.37x)" in text


@pytest.mark.parametrize("argv", [["--disk-gbps", "1.2"], ["--prefill-tokens-per-s", "0"],
                                  ["--prefill-tokens-per-s", "1000", "--host-gbps", "-3"]])
def test_bandwidths_without_a_rate_or_bad_numbers_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        exit_code = main(["plan", *argv])
        raise SystemExit(exit_code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err
