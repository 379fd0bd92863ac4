"""The library's one exception tree.

    TieredKVError
    ├── ConfigError              a config value, CLI argument or size string is wrong
    ├── SpecError                a spec, or tensors that do not match a spec
    │   └── SpecMismatchError    two pools / a record written for another spec
    ├── IndexValidationError     page or token indices rejected before any byte moved
    ├── PageKeyError             a page key that is not 1..512 printable ASCII characters
    ├── PoolError
    │   ├── PoolExhaustedError   not enough free host slots
    │   ├── DoubleFreeError      a slot freed twice
    │   ├── ForeignSlotError     a slot id this pool never handed out
    │   ├── UnsealedSlotError    a slot put to L3 that is not sealed for its key
    │   └── NoHostPoolError      a data call on a key-only backend (opened without a host pool)
    ├── RecordError              a stored page record failed verification: callers treat it as a miss
    │   ├── TruncatedRecordError
    │   ├── CorruptRecordError   bad magic, header or payload checksum
    │   │   ├── MisplacedRecordError  intact, but naming another page (or, of this spec, another size): deleted
    │   │   └── ForgedRecordError    no valid keyed tag for this reader's secret (docs/security.md)
    │   ├── ForeignRecordError   intact, but of another spec fingerprint or secret: left in place
    │   └── NotARecordError      no bytes-like buffer at all (also a TypeError)
    ├── BackendError             an L3 backend failed (not a miss)
    │   ├── BackendUnavailableError   cannot reach the server / medium
    │   ├── BackendNotWritableError   the medium refuses writes (read-only, no permission)
    │   └── BackendTimeoutError
    ├── MissingExtraError        an optional dependency is not installed (also an ImportError)
    └── MetricsServerError       the metrics endpoint cannot listen (address in use, not this machine's)

Dependency errors (redis, mooncake, OSError) are mapped at the boundary with ``raise ... from``.
"""

from __future__ import annotations


class TieredKVError(Exception):
    """Root of every error tiered-kv raises on purpose."""


class ConfigError(TieredKVError, ValueError):
    """A config value, CLI argument or size string is invalid."""


class SpecError(TieredKVError, ValueError):
    """A KV spec is inconsistent, or tensors do not match it."""


class SpecMismatchError(SpecError):
    """Two objects built for different specs were combined."""


class IndexValidationError(TieredKVError, ValueError):
    """Page ids or token indices were rejected before anything was moved."""


class PageKeyError(TieredKVError, ValueError):
    """A page key is not a str of 1..512 printable ASCII characters (see ``tiered_kv.model.keys``)."""


class PoolError(TieredKVError):
    """Misuse of a pool's allocator."""


class PoolExhaustedError(PoolError):
    """Not enough free slots for an allocation."""


class DoubleFreeError(PoolError):
    """A slot was freed that is already free (or already waiting to be freed)."""


class ForeignSlotError(PoolError, IndexValidationError):
    """A slot id that this pool never handed out (out of range or not allocated)."""


class UnsealedSlotError(PoolError, ValueError):
    """A slot handed to ``put_from`` is not sealed for its key (``HostPool.seal`` after the bytes land).

    Also a ValueError, which ``put_from`` raised before this class existed.
    """


class NoHostPoolError(PoolError):
    """A data call (``get_into`` / ``put_from``) on a backend opened without a host pool.

    Such a key-only backend (``open_backend(url, None)``) answers ``exists`` and ``delete`` only:
    the metadata half in a process that holds no host memory.
    """


class RecordError(TieredKVError):
    """A page record failed verification. Callers count it and treat it as a miss."""


class TruncatedRecordError(RecordError):
    """The record is shorter than its header says."""


class CorruptRecordError(RecordError):
    """Bad magic, unknown version, or a header / payload checksum mismatch."""


class ForgedRecordError(CorruptRecordError):
    """A reader holding a secret met a record under its key without a valid tag of that secret:
    no keyed tag at all (a plain checksum anyone can compute), or a tag that does not match.

    Forged, tampered with or damaged: a miss, counted apart (``BackendStats.forged``) and deleted
    as a corrupt record is. A record tagged with another secret is a ForeignRecordError instead.
    """


class NotARecordError(RecordError, TypeError):
    """What was passed as a record is no contiguous bytes-like buffer (a str, None, an int)."""


class MisplacedRecordError(CorruptRecordError):
    """The record is intact but names another page key, whatever its spec (or, of this spec, another
    payload size than the spec's): stored under the wrong name, it is of use to no reader, so it
    is deleted as any corrupt record is."""


class ForeignRecordError(RecordError):
    """The record is intact and names the page read, but belongs to another spec fingerprint.

    It is someone else's page: a miss for this reader, never deleted by it.
    """


class BackendError(TieredKVError):
    """An L3 backend failed. A miss is never an exception; this is."""


class BackendUnavailableError(BackendError):
    """The backend's server or medium cannot be reached."""


class BackendNotWritableError(BackendError):
    """The medium refuses writes (a read-only filesystem, a directory without write permission):
    a store that can never take a page."""


class BackendTimeoutError(BackendError, TimeoutError):
    """A backend call did not finish in time."""


class MissingExtraError(TieredKVError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (``pip install 'tiered-kv[redis]'``). A runtime failure of this installation (exit 1), not a
    bad value; also an ImportError for callers that catch that."""


class MetricsServerError(TieredKVError):
    """The metrics endpoint could not listen on its address (in use, not this machine's): a
    runtime failure (exit 1), not a bad value (a malformed address is a ConfigError)."""
