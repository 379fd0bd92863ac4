"""KVSpec sizes, presets and fingerprints."""

from __future__ import annotations

import pytest

from tiered_kv import mha_spec, mla_spec, model_spec, nsa_spec
from tiered_kv.errors import SpecError
from tiered_kv.spec import Component, KVSpec


def test_deepseek_v32_fp8_numbers():
    spec = nsa_spec(num_layers=61, page_size=64, latent_dtype="fp8")
    assert spec.components[0].bytes_per_layer == 64 * 656 == 41_984
    assert spec.components[1].bytes_per_layer == 64 * 128 + 64 * 4 == 8_448
    assert spec.bytes_per_token == 48_068
    assert spec.page_bytes == 3_076_352
    assert spec.component_bytes("latent") == 2_561_024
    assert spec.component_bytes("indexer") == 515_328


def test_nsa_bf16_latent_and_mla_and_mha():
    bf16 = nsa_spec(num_layers=61, page_size=64, latent_dtype="bf16")
    assert bf16.component("latent").bytes_per_layer == 64 * 1_152
    assert bf16.page_bytes == 61 * (64 * 1_152 + 8_448)
    mla = mla_spec(num_layers=61, page_size=64)
    assert mla.component("latent").bytes_per_layer == 64 * 576 * 2
    mha = mha_spec(num_layers=32, page_size=16, num_kv_heads=8, head_dim=128, dtype="bf16")
    assert [c.name for c in mha.components] == ["k", "v"]
    assert mha.page_bytes == 2 * 32 * 16 * 8 * 128 * 2
    assert mha.bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_chunk_offsets_are_component_then_layer_major():
    spec = nsa_spec(num_layers=3, page_size=64)
    lat, idx = spec.components
    assert spec.chunk_offset(0, 0) == 0
    assert spec.chunk_offset(0, 2) == 2 * lat.bytes_per_layer
    assert spec.chunk_offset(1, 0) == 3 * lat.bytes_per_layer
    assert spec.chunk_offset(1, 2) == 3 * lat.bytes_per_layer + 2 * idx.bytes_per_layer
    assert spec.chunk_offset(1, 2) + idx.bytes_per_layer == spec.page_bytes
    with pytest.raises(SpecError, match="layer 3"):
        spec.chunk_offset(0, 3)


def test_fingerprint_is_stable_and_sensitive():
    base = nsa_spec()
    assert base.fingerprint == nsa_spec().fingerprint
    assert len(base.fingerprint) == 32
    variants = [
        nsa_spec(latent_dtype="bf16"),
        nsa_spec(page_size=32),
        nsa_spec(num_layers=60),
        nsa_spec(layer_range=(0, 30)),
        nsa_spec(layer_range=(30, 61)),
        mla_spec(61, 64),
        mha_spec(61, 64, 8, 128, "bf16"),
        mha_spec(61, 64, 8, 128, "bf16", tp_rank=1, tp_size=2),
    ]
    prints = {v.fingerprint for v in variants}
    assert base.fingerprint not in prints
    assert len(prints) == len(variants)


def test_pipeline_stage_layer_range():
    stage = nsa_spec(num_layers=61, layer_range=(30, 61))
    assert stage.num_layers == 31
    assert stage.page_bytes == 31 * (41_984 + 8_448)
    with pytest.raises(SpecError, match="layer_range"):
        nsa_spec(num_layers=61, layer_range=(30, 62))


def test_model_presets():
    assert model_spec("deepseek-v3.2").page_bytes == 3_076_352
    with pytest.raises(SpecError, match="unknown model 'gpt-9'"):
        model_spec("gpt-9")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="x", page_size=0, layer_start=0, layer_end=1, components=(Component("a", 1),)), "page_size"),
        (dict(kind="x", page_size=1, layer_start=2, layer_end=2, components=(Component("a", 1),)), "layer range"),
        (dict(kind="x", page_size=1, layer_start=0, layer_end=1, components=()), "at least one"),
        (dict(kind="x", page_size=1, layer_start=0, layer_end=1, components=(Component("a", 1), Component("a", 2))), "unique"),
    ],
)
def test_invalid_specs(kwargs, message):
    with pytest.raises(SpecError, match=message):
        KVSpec(**kwargs)


def test_invalid_components_and_dtypes():
    with pytest.raises(SpecError, match="bytes_per_layer"):
        Component("latent", 0)
    with pytest.raises(SpecError, match="identifier"):
        Component("not a name", 4)
    with pytest.raises(SpecError, match="latent_dtype"):
        nsa_spec(latent_dtype="int4")
    with pytest.raises(SpecError, match="unknown dtype"):
        mha_spec(2, 16, 8, 128, "fp64")
