"""Backends from URLs, and a third-party backend registered through the entry-point group."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tiered_kv import HostPool
from tiered_kv.backends import available_schemes, backend_class, open_backend
from tiered_kv.backends.memory import MemoryBackend
from tiered_kv.errors import ConfigError

from .contract import SPEC, fill_and_seal, new_keys


@pytest.fixture
def plugin_on_path(tmp_path, monkeypatch):
    """An installed distribution (dist-info + module) that adds the scheme ``vault://``."""
    (tmp_path / "vault_backend.py").write_text(textwrap.dedent('''
        from tiered_kv.backends.memory import MemoryBackend, MemoryOptions

        class VaultBackend(MemoryBackend):
            scheme = "vault"

            @classmethod
            def from_url(cls, url, pool, **options):
                return cls(pool, MemoryOptions())

        NotABackend = object
    '''))
    dist = tmp_path / "vault_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vault-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[tiered_kv.backends]\nvault = vault_backend:VaultBackend\nbroken = vault_backend:NotABackend\n"
        "gone = vault_backend_removed:VaultBackend\nmisnamed = vault_backend:NoSuchClass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("vault_backend", None)


async def test_entry_point_backend_is_opened_by_url(plugin_on_path):
    assert "vault" in available_schemes()
    with HostPool(SPEC, 4) as pool:
        async with open_backend("vault://anything", pool) as backend:
            assert type(backend).__name__ == "VaultBackend"
            [key] = new_keys(1)
            slot = pool.allocate(1)
            fill_and_seal(pool, slot, [key])
            assert await backend.put_from([key], slot) == [True]
            assert await backend.exists([key]) == 1


def test_entry_point_must_name_a_backend(plugin_on_path):
    with pytest.raises(ConfigError, match="not a tiered_kv Backend subclass"):
        backend_class("broken")


def test_entry_point_that_cannot_be_loaded_is_a_config_error(plugin_on_path):
    with pytest.raises(ConfigError, match="'vault_backend_removed:VaultBackend' for scheme 'gone' cannot be loaded"):
        backend_class("gone")
    with pytest.raises(ConfigError, match="for scheme 'misnamed' cannot be loaded"):
        backend_class("misnamed")


def test_builtin_schemes():
    assert backend_class("memory") is MemoryBackend
    assert {"memory", "file", "redis", "rediss", "unix", "mooncake"} <= set(available_schemes())
    with pytest.raises(ConfigError, match="unknown backend scheme 'ftp'"):
        backend_class("ftp")


def test_url_options_are_typed():
    from dataclasses import dataclass

    from tiered_kv.backends.url_options import options_from_url

    @dataclass(frozen=True)
    class Options:
        workers: int = 1
        ratio: float | None = None
        limit: int | None = None
        fast: bool = False
        cache_bytes: int = 0
        name: str = ""

    got = options_from_url(Options, "x://h?workers=3&ratio=0.5&limit=7&fast=yes&cache_bytes=2KiB&name=n")
    assert got == Options(workers=3, ratio=0.5, limit=7, fast=True, cache_bytes=2048, name="n")
    with pytest.raises(ConfigError, match="option limit='seven': not a valid int"):
        options_from_url(Options, "x://h?limit=seven")
    with pytest.raises(ConfigError, match="fast='maybe'"):
        options_from_url(Options, "x://h?fast=maybe")
