"""Opening a backend from a URL: scheme -> backend class, built-ins plus an entry-point group.

Built-in classes are named by import path and imported on first use, so ``redis`` and
``mooncake`` are only needed by whoever opens those schemes. Third-party packages register
``scheme = "package.module:BackendClass"`` under the entry-point group ``tiered_kv.backends``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .base import Backend
from .url_options import split_url

if TYPE_CHECKING:  # annotations only: the host pool needs torch, listing a store does not
    from ..model.host_pool import HostPool

ENTRY_POINT_GROUP = "tiered_kv.backends"

_BUILTIN = {
    "memory": "tiered_kv.backends.memory:MemoryBackend",
    "file": "tiered_kv.backends.file:FileBackend",
    "redis": "tiered_kv.backends.redis:RedisBackend",
    "rediss": "tiered_kv.backends.redis:RedisBackend",
    "unix": "tiered_kv.backends.redis:RedisBackend",
    "mooncake": "tiered_kv.backends.mooncake:MooncakeBackend",
}


def _plugins() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_schemes() -> list[str]:
    return sorted(set(_BUILTIN) | set(_plugins()))


def backend_class(scheme: str) -> type[Backend]:
    """The class serving ``scheme``; ConfigError for an unknown one."""
    if scheme in _BUILTIN:
        module, _, name = _BUILTIN[scheme].partition(":")
        return getattr(importlib.import_module(module), name)
    plugin = _plugins().get(scheme)
    if plugin is None:
        raise ConfigError(f"unknown backend scheme {scheme!r}; known: {', '.join(available_schemes())}")
    try:
        cls = plugin.load()
    except (ImportError, AttributeError) as exc:  # a package installed but broken, or half removed
        raise ConfigError(f"entry point {plugin.value!r} for scheme {scheme!r} cannot be loaded: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"entry point {plugin.value!r} for scheme {scheme!r} is not a tiered_kv Backend subclass")
    return cls


def open_backend(url: str, pool: HostPool | None, **options: Any) -> Backend:
    """Open the backend named by ``url`` for ``pool`` (page_first). Options override URL query values.

    ``pool=None`` opens a key-only backend: ``exists`` and ``delete`` only, no host memory needed
    (the metadata half in a process of its own); its data calls raise ``NoHostPoolError``.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"backend URL must look like scheme://..., got {url!r}")
    return backend_class(split_url(url).scheme.lower()).from_url(url, pool, **options)
