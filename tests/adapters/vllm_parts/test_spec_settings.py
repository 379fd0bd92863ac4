"""The vLLM spec's own keys in ``kv_connector_extra_config``: a bad value is a ConfigError naming the
key, never a guessed default (``read_settings`` imports no vLLM, so this runs without it)."""

from __future__ import annotations

import pytest

from tiered_kv.adapters.vllm.settings import read_settings
from tiered_kv.errors import ConfigError

CHUNK = 1 << 20


@pytest.mark.parametrize("extra, error", [
    ({}, "give exactly one of 'l2_slots' and 'l2_bytes', got neither"),
    ({"l2_slots": 8, "l2_bytes": 1 << 30}, "got both"),
    ({"l2_slots": 0}, r"\['l2_slots'\] must be an int > 0, got 0"),
    ({"l2_slots": True}, r"\['l2_slots'\] must be an int > 0, got True"),
    ({"l2_bytes": "64GiB"}, r"\['l2_bytes'\] must be an int > 0, got '64GiB'"),
    ({"l2_bytes": CHUNK - 1}, r"\['l2_bytes'\] = 1048575 holds no block of 1048576 bytes"),
    ({"l2_slots": 8, "l3_url": "/mnt/kv"}, r"\['l3_url'\] must be a URL such as file:///dir"),
    ({"l2_slots": 8, "l3_uri": "file:///kv"}, "unknown key.s. l3_uri; tiered-kv reads l2_bytes, l2_slots, l3_url"),
    ({"l2_slots": 8, "salt": 7}, r"\['salt'\] must be a str, got int"),
])
def test_bad_extra_config_is_a_config_error_naming_the_key(extra, error):
    with pytest.raises(ConfigError, match=error):
        read_settings(extra, bytes_per_chunk=CHUNK, model="m")


def test_good_extra_config():
    settings = read_settings({"l2_bytes": 8 * CHUNK + 5, "l3_url": "file:///kv", "spec_name": "TieredKVSpec"},
                             bytes_per_chunk=CHUNK, model="m")
    assert (settings.l2_slots, settings.l3_url, settings.model, settings.salt) == (8, "file:///kv", "m", "")
