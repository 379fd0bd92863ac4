"""benchmarks/sglang_hicache.py on a few tiny pages: both sides move every page and report rates."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # SGLang warns that the CPU lacks CUDA

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "sglang_hicache.py"


def test_the_benchmark_measures_ours_and_the_bare_backend(sglang_model, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("sglang_hicache_benchmark", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    report = bench.main(["--pages", "2", "--repeats", "1", "--layers", "2", "--kinds", "dsa", "--l3", "memory", "file",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == report == json.loads(capsys.readouterr().out)
    rows = report["results"]
    # page_first_direct moves in place, and is measured staged too; the other layouts stage.
    assert [(r["layout"], r["l3"], r["in_place"]) for r in rows] == [
        (layout, l3, in_place) for layout in bench.KINDS["dsa"][2] for l3 in ("memory", "file")
        for in_place in ((True, False) if layout == "page_first_direct" else (False,))]
    for row in rows:
        assert row["contiguous"]["kv"] == (row["layout"] == "page_first_direct")
        for side in ("ours", "bare"):
            for op in ("set", "get"):
                assert row[side][op]["pages_per_s"] > 0 and row[side][op]["GB_per_s"] > 0
