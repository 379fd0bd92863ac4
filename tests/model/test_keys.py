"""Page keys: one per full page, chained, namespaced, stable across processes; typed errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tiered_kv.errors import ConfigError, IndexValidationError, PageKeyError, SpecError
from tiered_kv.model.keys import Namespace, check_key, page_keys

from ..hierarchy.conftest import NS, PAGE, SPEC

REPO = Path(__file__).resolve().parents[2]
TOKENS = np.random.default_rng(7).integers(0, 2**31, 5 * PAGE + 7)


def test_one_key_per_full_page_and_no_tail():
    keys = page_keys(NS, TOKENS)
    assert len(keys) == 5
    assert len(set(keys)) == 5
    assert page_keys(NS, TOKENS[:PAGE - 1]) == []
    # the incomplete tail does not change the full pages' keys
    assert page_keys(NS, TOKENS[:5 * PAGE]) == keys


def test_keys_are_128_bit_hex():
    for key in page_keys(NS, TOKENS):
        assert len(key) == 32 and int(key, 16) >= 0 and key == key.lower()
        assert check_key(key) == key


def test_prefix_property_and_chaining():
    full = page_keys(NS, TOKENS)
    for n in range(1, 5):
        assert page_keys(NS, TOKENS[:n * PAGE]) == full[:n]
    # a key names its whole prefix: the same page after another first page gets another key
    other = TOKENS.copy()
    other[0] += 1
    changed = page_keys(NS, other)
    assert all(a != b for a, b in zip(changed, full))
    # continuing a chain from a parent gives the same keys as hashing the whole prompt
    assert page_keys(NS, TOKENS[2 * PAGE:], parent=full[1]) == full[2:]
    # list, numpy of another dtype and a tensor give the same keys
    torch = pytest.importorskip("torch")
    assert page_keys(NS, [int(t) for t in TOKENS]) == full
    assert page_keys(NS, TOKENS.astype(np.uint32)) == full
    assert page_keys(NS, torch.from_numpy(TOKENS)) == full


@pytest.mark.parametrize("field, value", [
    ("model", "another/model"), ("spec_fingerprint", "f00"), ("revision", "r2"), ("kv_quant", "bf16"),
    ("layer_range", (0, 1)), ("lora_id", "lora-a"), ("tenant_salt", "tenant-b"), ("tp", (2, 1)),
])
def test_any_namespace_field_changes_every_key(field, value):
    base = page_keys(NS, TOKENS)
    changed = page_keys(dataclasses.replace(NS, **{field: value}), TOKENS)
    assert len(changed) == len(base)
    assert not set(changed) & set(base)


def test_page_size_changes_keys():
    assert not set(page_keys(dataclasses.replace(NS, page_size=PAGE // 2), TOKENS)) & set(page_keys(NS, TOKENS))


def test_extra_keys_change_from_their_page_on():
    base = page_keys(NS, TOKENS)
    extra = [None, None, "image:abc", None, None]
    with_image = page_keys(NS, TOKENS, extra)
    assert with_image[:2] == base[:2]
    assert all(a != b for a, b in zip(with_image[2:], base[2:]))
    # the encoding is length-prefixed: ["ab", "c"] and ["a", "bc"] differ
    assert page_keys(NS, TOKENS, [["ab", "c"]]) != page_keys(NS, TOKENS, [["a", "bc"]])
    assert page_keys(NS, TOKENS, [b"image:abc"] + [None] * 4) != base


_CHILD = """
import json, sys
import numpy as np
from tiered_kv.model.keys import Namespace, page_keys
ns = Namespace(**json.loads(sys.argv[1]))
print(json.dumps(page_keys(ns, np.array(json.loads(sys.argv[2])))))
"""


def test_stable_across_processes_and_hash_seeds():
    fields = dataclasses.asdict(NS)
    here = page_keys(NS, TOKENS)
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(fields), json.dumps(TOKENS.tolist())],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True)
        # tuples come back from JSON as lists: the namespace must still digest the same
        assert json.loads(out.stdout) == here


@pytest.mark.parametrize("tokens, match", [
    ([1, 2, -1] + [0] * PAGE, r"token_ids\[2\]"),
    ([1, 2**32] + [0] * PAGE, r"token_ids\[1\]"),
    ([1.5] * PAGE, "token_ids"),
    (["a"] * PAGE, r"token_ids\[0\]"),
    ("abc", "str"),
    (np.zeros((2, PAGE), dtype=np.int64), "1-D"),
    (np.zeros(PAGE, dtype=np.float32), "integers"),
    ([True] * PAGE, "token_ids"),
])
def test_bad_token_ids_are_typed_errors(tokens, match):
    with pytest.raises(IndexValidationError, match=match):
        page_keys(NS, tokens)


@pytest.mark.parametrize("parent", ["not-hex-at-all", "ab" * 8, "", 123, "zz" * 16])
def test_bad_parent_is_a_page_key_error(parent):
    with pytest.raises(PageKeyError, match="parent"):
        page_keys(NS, TOKENS, parent=parent)


def test_bad_extra_and_namespace():
    with pytest.raises(IndexValidationError, match=r"extra\[5\]"):
        page_keys(NS, TOKENS, [None] * 5 + [7])  # the tail's entry is ignored, but must still be a key
    with pytest.raises(IndexValidationError, match="extra"):
        page_keys(NS, TOKENS, "image")
    with pytest.raises(IndexValidationError, match=r"extra\[0\]"):
        page_keys(NS, TOKENS, [[1.5]])
    with pytest.raises(ConfigError, match="Namespace"):
        page_keys("not a namespace", TOKENS)
    with pytest.raises(ConfigError, match="page_size"):
        Namespace(model="m", spec_fingerprint="f", page_size=0)
    with pytest.raises(ConfigError, match="tp"):
        Namespace(model="m", spec_fingerprint="f", page_size=4, tp=(2, 2))
    with pytest.raises(ConfigError, match="model"):
        Namespace(model="", spec_fingerprint="f", page_size=4)


@pytest.mark.parametrize("tokens", [None, 5, 3.0])
def test_token_ids_that_are_no_sequence_are_typed_errors(tokens):
    # None and 5 were a bare TypeError ("object is not iterable").
    with pytest.raises(IndexValidationError, match="token_ids"):
        page_keys(NS, tokens)


def test_extra_entries_of_the_tail_are_ignored():
    # One entry per token page of the prompt, the incomplete tail's included (audit finding 6):
    # the tail gets no key, so its entry names nothing; before, this was an IndexValidationError.
    extra = [None, "image:1", None, None, "image:2", "image:tail"]
    keys = page_keys(NS, TOKENS, extra)
    assert keys == page_keys(NS, TOKENS, extra[:5])
    assert keys != page_keys(NS, TOKENS)
    # A prefix keyed with the whole prompt's list: a prefix of the whole prompt's keys.
    assert page_keys(NS, TOKENS[:2 * PAGE + 3], extra) == keys[:2]
    assert page_keys(NS, TOKENS[:PAGE - 1], extra) == []


@pytest.mark.parametrize("extra", [5, [5], [[5]], [[1, 2]], [{"a": 1}]])
def test_extra_keys_are_str_or_bytes_only(extra):
    # [[5]] hashed bytes(5), five zero bytes, and extra=5 was a bare TypeError.
    with pytest.raises(IndexValidationError, match="extra"):
        page_keys(NS, TOKENS, extra)
    assert page_keys(NS, TOKENS[:PAGE], [[b"ab", bytearray(b"c"), "d"]]) == page_keys(NS, TOKENS[:PAGE], [[b"ab", b"c", "d"]])


@pytest.mark.parametrize("field, value", [("layer_range", 5), ("layer_range", (True, True)), ("layer_range", (0, 1, 2)),
                                          ("layer_range", "0:4"), ("tp", "2"), ("tp", (True, False)), ("tp", (2, 1, 0)),
                                          ("tp", (2.0, 1))])
def test_namespace_pairs_are_two_ints(field, value):
    # 5 and "2" were bare TypeError / ValueError from unpacking; bools were taken as 1 / 0.
    with pytest.raises(ConfigError, match=f"Namespace.{field}"):
        Namespace(model="m", spec_fingerprint="f", page_size=4, **{field: value})


@pytest.mark.parametrize("key", ["", "a\nb", "é", "x" * 513, None, b"bytes"])
def test_check_key_refuses(key):
    with pytest.raises(PageKeyError):
        check_key(key)


def test_empty_prompt_has_no_keys():
    assert page_keys(NS, []) == [] and page_keys(NS, np.array([], dtype=np.int32)) == []


def test_page_keys_and_namespace_are_public_at_the_top():
    import tiered_kv
    from tiered_kv.model import keys as keys_module

    assert tiered_kv.page_keys is keys_module.page_keys and tiered_kv.Namespace is keys_module.Namespace
    ns = tiered_kv.Namespace(model="m", spec_fingerprint="00" * 16, page_size=4)
    assert tiered_kv.page_keys(ns, list(range(9))) == keys_module.page_keys(ns, list(range(9)))
    assert len(tiered_kv.page_keys(ns, list(range(9)))) == 2


@pytest.mark.parametrize("spec", ["x", None, 5, {"dims": ()}])
def test_for_spec_of_what_is_no_spec_is_a_spec_error(spec):
    # "x" was a bare AttributeError ('str' object has no attribute 'dims').
    with pytest.raises(SpecError, match="for_spec: spec must be a KVSpec"):
        Namespace.for_spec(spec, model="m")


def test_for_spec_names_an_unknown_field_and_takes_known_ones():
    # bogus=1 was a bare TypeError (unexpected keyword argument).
    with pytest.raises(ConfigError, match="unknown field.*bogus"):
        Namespace.for_spec(SPEC, "m", bogus=1)
    with pytest.raises(ConfigError, match="Namespace.model"):
        Namespace.for_spec(SPEC, 5)
    assert Namespace.for_spec(SPEC, "m", tenant_salt="t").tenant_salt == "t"


def test_a_namespace_built_from_lists_is_the_one_built_from_tuples():
    as_tuples = Namespace("m", "fp", 16, layer_range=(0, 4), tp=(2, 1))
    as_lists = Namespace("m", "fp", 16, layer_range=[0, 4], tp=[2, 1])
    assert as_lists == as_tuples and hash(as_lists) == hash(as_tuples)
    assert as_lists.layer_range == (0, 4) and as_lists.tp == (2, 1)
    tokens = list(range(4 * 16))
    assert page_keys(as_lists, tokens) == page_keys(as_tuples, tokens)
