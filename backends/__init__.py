"""L3 storage backends behind one async, batch-first interface (``Backend``).

Open one with ``open_backend(url, pool)``: ``memory://``, ``file:///path``, ``redis://host:port/db``,
``rediss://...``, ``unix:///path/redis.sock``, ``mooncake://host:port?...``. Other packages add
schemes through the entry-point group ``tiered_kv.backends`` (value: a ``Backend`` subclass).

Backends import only the page record, the host pool and the error types; never the controller.
"""

from .base import Backend, BackendStats, Capabilities
from .registry import available_schemes, backend_class, open_backend

__all__ = ["Backend", "BackendStats", "Capabilities", "available_schemes", "backend_class", "open_backend"]
