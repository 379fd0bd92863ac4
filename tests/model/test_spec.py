"""KVSpec sizes, presets and fingerprints."""

from __future__ import annotations

import pytest

from tiered_kv import mha_spec, mla_spec, model_spec, nsa_spec
from tiered_kv.errors import SpecError
from tiered_kv.model.spec import Component, KVSpec


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


# --- factories take integers only, and name the argument that is wrong ---------------------------
@pytest.mark.parametrize("make", [lambda **kw: nsa_spec(2, **kw), lambda **kw: mla_spec(2, **kw),
                                  lambda **kw: mha_spec(2, num_kv_heads=8, head_dim=128, **kw)])
@pytest.mark.parametrize("page_size", [0, -64, True, 64.0, "64", None])
def test_a_bad_page_size_is_named_as_such(make, page_size):
    # page_size=0 used to say "component 'latent': bytes_per_layer must be > 0"; True and 64.0 built a spec.
    with pytest.raises(SpecError, match="page_size"):
        make(page_size=page_size)


@pytest.mark.parametrize("num_layers", [0, -1, True, 2.0, "2", None])
def test_a_bad_layer_count_is_named_as_such(num_layers):
    with pytest.raises(SpecError, match="num_layers"):
        nsa_spec(num_layers)
    with pytest.raises(SpecError, match="num_layers"):
        mla_spec(num_layers, 64)


@pytest.mark.parametrize("layer_range", ["0:2", (0, 1, 2), (False, True), (0.0, 2), 3])
def test_a_layer_range_is_a_pair_of_ints(layer_range):
    with pytest.raises(SpecError, match="layer_range"):
        nsa_spec(4, layer_range=layer_range)


@pytest.mark.parametrize("num_layers", [62, 0, True])
def test_a_preset_has_no_more_layers_than_its_model(num_layers):
    # 62 used to build a 62-layer "deepseek-v3.2", and 0 the whole model.
    with pytest.raises(SpecError, match="num_layers"):
        model_spec("deepseek-v3.2", num_layers=num_layers)
    assert model_spec("deepseek-v3.2", num_layers=61) == model_spec("deepseek-v3.2")


@pytest.mark.parametrize("kwargs", [dict(page_size=True), dict(layer_start=False, layer_end=1), dict(layer_end=1.0)])
def test_kvspec_fields_are_ints(kwargs):
    fields = dict(kind="x", page_size=1, layer_start=0, layer_end=1, components=(Component("a", 1),))
    with pytest.raises(SpecError):
        KVSpec(**{**fields, **kwargs})
    with pytest.raises(SpecError, match="bytes_per_layer"):
        Component("a", True)


@pytest.mark.parametrize("component_index", [2, -1, True, 1.0])
def test_chunk_offset_refuses_a_component_index_outside_the_spec(component_index):
    # 2 leaked IndexError; -1 silently gave the offset of the last component.
    spec = nsa_spec(num_layers=3, page_size=64)
    with pytest.raises(SpecError, match="component index"):
        spec.chunk_offset(component_index, 0)


@pytest.mark.parametrize("kwargs, field", [
    (dict(kv_lora_rank=100), "kv_lora_rank"),  # fp8 latent: one fp32 scale per 128 nope values
    (dict(kv_lora_rank=200), "kv_lora_rank"),
    (dict(index_head_dim=100), "index_head_dim"),  # indexer: one fp32 scale per quant block
    (dict(index_head_dim=192, quant_block=128), "index_head_dim"),
])
def test_nsa_dims_that_do_not_fill_whole_quant_blocks_are_refused(kwargs, field):
    # kv_lora_rank=100 gave a latent with 0 scales, index_head_dim=100 an indexer with 0 scales.
    with pytest.raises(SpecError, match=field):
        nsa_spec(num_layers=2, **kwargs)
    if field == "kv_lora_rank":  # the bf16 latent has no scales: any rank is a layout
        assert nsa_spec(num_layers=2, latent_dtype="bf16", **kwargs).page_bytes > 0


@pytest.mark.parametrize("dtype", [["bf16"], {"bf16": 2}])
def test_an_unhashable_dtype_is_a_spec_error(dtype):
    with pytest.raises(SpecError, match="unknown dtype"):
        mha_spec(4, 64, 8, 128, dtype)


@pytest.mark.parametrize("model, dtype", [("llama-3.1-8b", "bf16"), ("llama-3.1-8b", "fp8"), ("deepseek-v3", "fp8")])
def test_model_spec_refuses_a_latent_dtype_its_kind_cannot_store(model, dtype):
    with pytest.raises(SpecError, match=f"latent_dtype '{dtype}': {model}"):
        model_spec(model, latent_dtype=dtype)
    assert model_spec(model).fingerprint  # the preset's own dtype still builds


def test_model_spec_latent_dtype_defaults_to_the_presets_own():
    assert model_spec("deepseek-v3.2") == model_spec("deepseek-v3.2", latent_dtype="fp8")
    assert model_spec("deepseek-v3.2", latent_dtype="bf16").page_bytes != model_spec("deepseek-v3.2").page_bytes
    assert model_spec("deepseek-v3", latent_dtype="bf16") == model_spec("deepseek-v3")
