"""The spec's keys in ``kv_connector_extra_config``, checked once with ConfigErrors naming the key.

It must never guess a size: a missing or unusable value is an error, not a default that hides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tiered_kv.errors import ConfigError

#: The extra-config keys this spec reads (vLLM's own keys pass through untouched).
OWN_KEYS = ("l2_bytes", "l2_slots", "l3_url", "model", "salt")
#: vLLM's keys that may sit beside ours.
VLLM_KEYS = ("spec_name", "spec_module_path", "offload_prompt_only", "self_describing_kv_events",
             "block_size", "eviction_policy", "store_threshold")


@dataclass(frozen=True)
class SpecSettings:
    l2_slots: int
    model: str
    salt: str
    l3_url: str | None = None   # file:///dir, redis://host:port/0, mooncake://..., memory://; None: L2 only


def _positive_int(extra: Mapping[str, Any], key: str) -> int | None:
    value = extra.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"kv_connector_extra_config[{key!r}] must be an int > 0, got {value!r}")
    return value


def _text(extra: Mapping[str, Any], key: str, default: str) -> str:
    value = extra.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"kv_connector_extra_config[{key!r}] must be a str, got {type(value).__name__}")
    return value


def read_settings(extra: Mapping[str, Any], *, bytes_per_chunk: int, model: str) -> SpecSettings:
    """The spec's settings from vLLM's extra config; ``bytes_per_chunk`` turns l2_bytes into slots."""
    unknown = sorted(k for k in extra if k.startswith(("l2_", "l3_")) and k not in OWN_KEYS)
    if unknown:
        raise ConfigError(f"kv_connector_extra_config: unknown key(s) {', '.join(unknown)}; "
                          f"tiered-kv reads {', '.join(OWN_KEYS)}")
    slots = _positive_int(extra, "l2_slots")
    size = _positive_int(extra, "l2_bytes")
    if (slots is None) == (size is None):
        raise ConfigError("kv_connector_extra_config: give exactly one of 'l2_slots' and 'l2_bytes', "
                          f"got {'both' if slots else 'neither'}")
    if slots is None:
        slots = size // bytes_per_chunk
        if slots < 1:
            raise ConfigError(f"kv_connector_extra_config['l2_bytes'] = {size} holds no block of {bytes_per_chunk} bytes")
    l3_url = extra.get("l3_url")
    if l3_url is not None and (not isinstance(l3_url, str) or "://" not in l3_url):
        raise ConfigError(f"kv_connector_extra_config['l3_url'] must be a URL such as file:///dir or "
                          f"redis://host:6379/0, got {l3_url!r}")
    return SpecSettings(l2_slots=slots, model=_text(extra, "model", model) or model,
                        salt=_text(extra, "salt", ""), l3_url=l3_url)
