"""``tiered-kv bench transfer``: backup / load / one-layer GB/s through the real TransferEngine,
and its own check that what it loaded is what it backed up."""

from __future__ import annotations

import json

import pytest
import torch

from tiered_kv import allocate_engine_like
from tiered_kv.ops.bench.transfer import _pages_wrong, measure
from tiered_kv.ops.cli import main
from tiered_kv.model.spec import model_spec
from tiered_kv.transfers.policy import PATHS


@pytest.mark.parametrize(("model", "layout", "path"), [
    ("deepseek-v3.2", "page_first", "auto"),
    ("deepseek-v3.2", "layer_first", "direct"),
    ("llama-3.1-8b", "page_first", "torch"),
])
def test_json_on_cpu(model, layout, path, capsys):
    assert main(["bench", "transfer", "--model", model, "--layers", "3", "--pages", "3", "--layout", layout,
                 "--path", path, "--device", "cpu", "--repeat", "2", "--warmup", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    spec = model_spec(model, layer_range=(0, 3))
    assert result["pages_wrong"] == 0
    assert result["fingerprint"] == spec.fingerprint and result["page_bytes"] == spec.page_bytes
    assert result["layer_bytes"] * 3 == spec.page_bytes
    assert result["layout"] == layout and result["device"] == "cpu"
    for name in ("backup", "load", "load_one_layer"):
        assert result[f"{name}_gbps"] > 0
        assert result[f"{name}_path"] in PATHS and result[f"{name}_path"] != "auto"
        if path != "auto":
            assert result[f"{name}_path"] == path


def test_table(capsys):
    assert main(["bench", "transfer", "--layers", "2", "--pages", "2", "--device", "cpu", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "backup (all layers)" in out and "load (layer 1)" in out and "pages wrong: 0" in out


def test_pages_wrong_counts_a_page_that_differs():
    """The self-check must be able to fail: one flipped byte in one loaded page is one page wrong."""
    spec = model_spec("deepseek-v3.2", layer_range=(0, 2))
    pool = allocate_engine_like(spec, 5, "cpu")
    for ci in range(len(spec.components)):
        for layer in range(spec.num_layers):
            view = pool.chunk_view(ci, layer)
            view[1:3].random_(0, 256)
            view[3:5] = view[1:3]
    assert _pages_wrong(pool, spec, [1, 2], [3, 4]) == 0
    pool.chunk_view(1, 1)[4, 17] ^= 0xFF  # the indexer of the last layer of the second page
    assert _pages_wrong(pool, spec, [1, 2], [3, 4]) == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--layers", "62"], "deepseek-v3.2 has 61 layers"),
    (["--pages", "0"], "--pages must be > 0, got 0"),
    (["--path", "warp"], "invalid choice"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    try:
        code = main(["bench", "transfer", "--device", "cpu", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_bad_input(capsys):
    assert main(["bench", "transfer", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_gpu():
    result = measure(model_spec("deepseek-v3.2"), pages=16, device="cuda", repeat=3)
    assert result["pages_wrong"] == 0
    assert result["backup_gbps"] > 1 and result["load_gbps"] > 1
