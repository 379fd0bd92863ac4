"""tiered-kv for SGLang: its HiCache storage backend and its external cache linker.

Exports resolve lazily so that importing this package never imports SGLang; a name is
loaded from its module on first use.
"""

from importlib import import_module

_EXPORTS = {
    "HiCacheBackend": ".hicache",
    "Linker": ".linker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module_name, __name__), name)
