"""docs/config.md lists every key of the config tree (and of each backend's options) with its
default, and no key the models lack."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from pathlib import Path

from pydantic import BaseModel

from tiered_kv.config.loader import SIZE_KEYS
from tiered_kv.config.models import OPTION_CLASSES, Config
from tiered_kv.model.sizes import parse_size

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"
ROW = re.compile(r"^\| `([a-z0-9_.:]+)` \| [^|]*(?:\\\|[^|]*)* \| ([^|]+) \| .+ \|$")


def documented() -> dict[str, str]:
    rows = {}
    for line in DOCS.read_text().splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"docs/config.md lists {m.group(1)} twice"
            rows[m.group(1)] = m.group(2).strip()
    return rows


def model_keys(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            out.update(model_keys(kind, prefix + name + "."))
        else:
            out[prefix + name] = field.get_default(call_default_factory=True)
    return out


def option_keys() -> dict[str, object]:
    return {f"{scheme}:{f.name}": (None if f.default is dataclasses.MISSING else f.default)
            for scheme, cls in OPTION_CLASSES.items() for f in dataclasses.fields(cls)}


def read_default(text: str, value: object, size: bool) -> object:
    """The docs' default cell as the value it names."""
    if text == "(from the URL)":
        return None
    text = text.strip("`")
    if text == "null":
        return None
    if isinstance(value, bool):
        return {"true": True, "false": False}[text]
    if isinstance(value, Enum):
        return type(value)(text)
    if size:
        return parse_size(text)
    if isinstance(value, float):
        return float(text)
    if isinstance(value, int):
        return int(text)
    if isinstance(value, dict):
        return {} if text == "{}" else text
    return "" if text == '""' else text


def test_docs_list_every_key_with_its_default() -> None:
    rows = documented()
    keys = {**model_keys(), **option_keys()}
    missing = sorted(set(keys) - set(rows))
    assert not missing, f"docs/config.md lacks {missing}"
    for key, default in keys.items():
        size = key in SIZE_KEYS or key.split(":")[-1].endswith("_bytes")
        assert read_default(rows[key], default, size) == default, f"{key}: docs say {rows[key]}, the model {default!r}"


def test_docs_list_no_key_the_models_lack() -> None:
    extra = sorted(set(documented()) - set(model_keys()) - set(option_keys()))
    assert not extra, f"docs/config.md lists keys the models lack: {extra}"


URLS = {"file": "file:///tmp/tiered-kv-docs-check", "memory": "memory://", "redis": "redis://127.0.0.1:6379/0",
        "mooncake": "mooncake://127.0.0.1:50051"}


def _meanings() -> dict[str, str]:
    return {line.split("`")[1]: line.rsplit("|", 2)[-2] for line in DOCS.read_text().splitlines()
            if ROW.match(line) and ":" in line.split("`")[1]}


def test_options_the_docs_call_url_only_are_refused_as_options_and_only_those() -> None:
    """docs/config.md and the URL parsers agree on which option fields come from the URL alone."""
    from tiered_kv.config import load_config
    from tiered_kv.errors import ConfigError

    meanings = _meanings()
    url_only = {key for key, meaning in meanings.items() if "refused as an option" in meaning}
    assert url_only == {"file:path", "redis:host", "redis:port", "redis:path", "redis:tls", "mooncake:master"}
    for key, default in option_keys().items():
        scheme, name = key.split(":")
        value = default if default is not None else "x"
        try:
            load_config(overrides={"l3": {"url": URLS[scheme], "options": {name: value}}}, env={})
            refused = False
        except ConfigError as exc:
            refused = "comes from the URL itself" in str(exc)
        assert refused == (key in url_only), f"{key}: docs say {meanings[key]!r}"


def test_dev_stack_docs_point_the_mooncake_config_at_other_ports() -> None:
    """docs/dev-stack.md's override for a dev stack on other ports moves both the master and the
    metadata server: the URL alone leaves ``l3.options.metadata_server`` on the file's port 8080."""
    from tiered_kv.config import load_config

    repo = DOCS.parents[1]
    text = (repo / "docs" / "dev-stack.md").read_text()
    ports = {"REDIS_PORT": "16379", "MOONCAKE_RPC_PORT": "15051", "MOONCAKE_HTTP_PORT": "18080"}
    assigned = {name: re.sub(r"\$(\w+)", lambda m: ports[m.group(1)], value)
                for name, value in re.findall(r'^\s*(TIERED_KV_L3__\w+)="([^"]+)"', text, re.M)}
    env = {k: v for k, v in assigned.items() if k in {"TIERED_KV_L3__URL", "TIERED_KV_L3__OPTIONS__METADATA_SERVER"}}
    assert "TIERED_KV_L3__OPTIONS__METADATA_SERVER" in env, "the docs do not say how to move the metadata server"
    mooncake = load_config(repo / "examples/configs/devstack-mooncake.yaml", env=env).l3.backend_options()
    assert mooncake.master == "127.0.0.1:15051"
    assert mooncake.metadata_server == "http://127.0.0.1:18080/metadata"
    url_only = {"TIERED_KV_L3__URL": env["TIERED_KV_L3__URL"]}
    stale = load_config(repo / "examples/configs/devstack-mooncake.yaml", env=url_only).l3.backend_options()
    assert stale.metadata_server == "http://127.0.0.1:8080/metadata"  # why the docs must say it
