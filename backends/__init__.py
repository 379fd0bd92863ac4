"""L3 storage backends behind one async, batch-first interface (``Backend``).

Open one with ``open_backend(url, pool)``: ``memory://``, ``file:///path``, ``redis://host:port/db``,
``rediss://...``, ``unix:///path/redis.sock``, ``mooncake://host:port?...``. Other packages add
schemes through the entry-point group ``tiered_kv.backends`` (value: a ``Backend`` subclass).

``open_backend(url, None)`` opens a key-only backend (``exists`` and ``delete``, no host memory) for
a metadata half that lives in another process than the workers; see ``base``.

Backend authors subclass ``Backend`` and answer ``_get`` with ``True`` / ``False`` or one of
``OtherLength`` (a value of another length: the base tells another reader's page from a damaged
one) and ``NotARecord`` (an object that is no record and not ours to delete).

Backends import only the page record, the host pool and the error types; never the controller.
"""

from .base import Backend, BackendStats, Capabilities, NotARecord, OtherLength
from .registry import available_schemes, backend_class, open_backend

__all__ = ["Backend", "BackendStats", "Capabilities", "NotARecord", "OtherLength", "available_schemes", "backend_class",
           "open_backend"]
