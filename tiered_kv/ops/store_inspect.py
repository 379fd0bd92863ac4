"""``tiered-kv inspect URL [--verify] [--json]``: what an L3 store holds, and whether it is intact.

Counts the records of a store (``file://``, ``redis://``; any backend that implements ``scan``),
their bytes, and the records per spec fingerprint (each record's own header, ``record.read_header``).
With ``--verify`` every record is read whole and checked against its own header
(``record.verify`` with the header's fingerprint, key and payload length), and the corrupt ones
are listed with the reason. A record is corrupt when its header does not parse, its payload
checksum does not match, it is stored under another name than its key's, or its stored length is
not the one its header implies; without ``--verify`` only the payload checksum goes unchecked.
Objects in the namespace that are no byte value (a Redis list under the prefix) are listed apart,
as the backends leave them alone too. A Redis store is listed under its key prefix (the URL's
``prefix`` option, else the default ``tkv:``), which the output names: keys outside it are not
looked at.

Keyed records (sealed with a tenant's secret, docs/security.md) are counted per key id. Their tag
is checked only with that secret: ``TIERED_KV_SECURITY__SECRET`` in the environment (never an
argument, which ``ps`` would show). Under ``--verify`` a keyed record of a secret not given is
counted ``unverified``, not corrupt: nothing without the secret can tell it intact.

It never deletes or changes anything (unlike ``get_into``, which deletes a corrupt record it
meets): the backend is opened with ``Backend.open_for_reading``. ``memory://`` stores live inside
one process, so the command line refuses them; ``inspect_backend(backend)`` inspects one in-process.

Exit codes: 0 every record intact, 1 a corrupt record found, 2 bad usage or a store that cannot
be listed (Mooncake's client has no listing call).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..model import record
from ..model.record_key import RecordKey, record_key as make_record_key
from ..errors import ConfigError, RecordError
from ..model.sizes import format_size

#: Records read and verified at once: enough to keep a remote medium busy, few enough MB in memory.
READ_AHEAD = 8
#: Where ``tiered-kv inspect`` finds the secret whose keyed records it checks (the config's variable).
SECRET_ENV = "TIERED_KV_SECURITY__SECRET"


@dataclass
class SpecCount:
    records: int = 0
    bytes: int = 0
    payload_bytes: int = 0  # one record's payload, from its header


@dataclass
class Finding:
    name: str  # the stored name (file: ab/<sha>.page; redis / memory: the key)
    key: str | None  # the page key its header names, where the header parses
    reason: str


@dataclass
class Inspection:
    """What ``inspect_backend`` found. ``records`` and ``bytes`` count everything that holds bytes
    (corrupt records included); ``specs`` only the records whose header parses, so ``records`` is
    their sum plus ``without_spec``. As JSON, ``count`` (top level and per spec) is ``records``."""

    backend: str
    verified: bool
    prefix: str | None = None  # the key prefix listed (Redis), where the URL's path does not say it all
    records: int = 0
    bytes: int = 0
    specs: dict[str, SpecCount] = field(default_factory=dict)
    corrupt: list[Finding] = field(default_factory=list)
    not_records: list[Finding] = field(default_factory=list)
    vanished: int = 0  # listed, then gone before it was read (evicted or deleted meanwhile)
    key_ids: dict[str, int] = field(default_factory=dict)  # keyed records per key id of their secret
    unverified: int = 0  # keyed records whose tag was not checked: their secret was not given

    @property
    def ok(self) -> bool:
        return not self.corrupt

    @property
    def without_spec(self) -> int:
        """Records counted in ``records`` but under no fingerprint: their header does not parse."""
        return self.records - sum(c.records for c in self.specs.values())

    def as_json(self) -> dict:
        # ``count`` and ``records`` are the same number under both names readers of this JSON use.
        return {
            "backend": self.backend,
            "prefix": self.prefix,
            "verified": self.verified,
            "count": self.records,
            "records": self.records,
            "bytes": self.bytes,
            "without_spec": self.without_spec,
            "specs": {fp: {"count": c.records, **vars(c)} for fp, c in sorted(self.specs.items())},
            "corrupt": [vars(f) for f in self.corrupt],
            "not_records": [vars(f) for f in self.not_records],
            "vanished": self.vanished,
            "key_ids": dict(sorted(self.key_ids.items())),
            "unverified": self.unverified,
        }


async def inspect_backend(backend, *, verify: bool = False, label: str | None = None,
                          record_key: RecordKey | None = None) -> Inspection:
    """Walk ``backend``'s store (``scan``), reading each record's header, or with ``verify`` the
    whole record and checking it (keyed records of ``record_key``'s secret with it). Reads only.
    ConfigError where the medium cannot be listed."""
    found = Inspection(backend=label or backend.scheme, verified=verify, prefix=key_prefix(backend))
    batch: list[tuple[str, int]] = []
    async for name, size in backend.scan():
        if size is None:
            found.not_records.append(Finding(name, None, "not a byte value (another type of object)"))
            continue
        batch.append((name, size))
        if len(batch) == READ_AHEAD:
            await _examine(backend, batch, verify, found, record_key)
            batch = []
    if batch:
        await _examine(backend, batch, verify, found, record_key)
    return found


def key_prefix(backend) -> str | None:
    """The key prefix ``backend.scan`` lists under (a Redis store's ``prefix`` option), else None."""
    prefix = getattr(getattr(backend, "options", None), "prefix", None)
    return prefix if isinstance(prefix, str) else None


async def _examine(backend, batch: list[tuple[str, int]], verify: bool, found: Inspection,
                   key: RecordKey | None = None) -> None:
    length = None if verify else record.HEADER_BYTES
    values = await asyncio.gather(*(backend.read_stored(name, length) for name, _ in batch))
    # Checksums on a thread (xxh3 releases the GIL): the next reads overlap this batch's checks.
    verdicts = await asyncio.to_thread(lambda: [_verdict(backend, name, size, value, verify, key)
                                                for (name, size), value in zip(batch, values)])
    for (name, size), value, (header, reason) in zip(batch, values, verdicts):
        if value is None:
            found.vanished += 1
            continue
        if not isinstance(value, (bytes, bytearray)):
            found.not_records.append(Finding(name, None, value.reason))
            continue
        found.records += 1
        found.bytes += size
        if header is not None:
            count = found.specs.setdefault(header.fingerprint, SpecCount())
            count.records += 1
            count.bytes += size
            count.payload_bytes = header.payload_len
            if header.keyed:
                key_id = header.key_id.hex()
                found.key_ids[key_id] = found.key_ids.get(key_id, 0) + 1
                if verify and reason is None and (key is None or header.key_id != key.key_id):
                    found.unverified += 1
        if reason is not None:
            found.corrupt.append(Finding(name, header.key if header else None, reason))


def _verdict(backend, name: str, size: int, value, verify: bool,
             key: RecordKey | None = None) -> tuple[record.RecordHeader | None, str | None]:
    """(the header where it parses, why the record is corrupt or None). A keyed record is checked
    with ``key`` where it is of that key's secret, else only its header (it cannot be more)."""
    if not isinstance(value, (bytes, bytearray)):
        return None, None
    try:
        header = record.read_header(value)
    except RecordError as exc:
        return None, str(exc)
    if backend.stored_name(header.key) != name:
        return header, f"stored as {name!r}, but its header names page {header.key[:64]!r} (stored elsewhere)"
    expected = backend.stored_length(record.HEADER_BYTES + header.payload_len)
    if size != expected:
        return header, f"stored value is {size:,} B; a record of a {header.payload_len:,} B payload is stored in {expected:,} B"
    if verify and not (header.keyed and (key is None or header.key_id != key.key_id)):
        try:
            record.verify(value, fingerprint=header.fingerprint, key=header.key, payload_len=header.payload_len,
                          record_key=key if header.keyed else None)
        except RecordError as exc:
            return header, str(exc)
    return header, None


# --- the command ---------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``tiered-kv inspect`` parser's arguments, description and ``func``."""
    p.description = ("Count the records of an L3 store per spec fingerprint; --verify checks every record. Reads "
                     "only. Exit codes: 0 intact, 1 corrupt records found, 2 bad usage or a store that cannot be listed.")
    p.add_argument("url", metavar="URL", help="backend URL, e.g. file:///mnt/nvme/kv or redis://127.0.0.1:6379/0")
    p.add_argument("--verify", action="store_true", help="read every record whole and check its checksums (keyed "
                   f"records' tags with the secret in ${SECRET_ENV}, where set)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def open_for_inspection(url: str):
    """The backend of ``url`` opened read-only and key-only; ConfigError for a store no other
    process can see (``memory://``)."""
    from ..backends import backend_class
    from ..backends.url_options import split_url

    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"backend URL must look like scheme://..., got {url!r}")
    from ..backends import Backend

    cls = backend_class(split_url(url).scheme.lower())
    if cls.scan is Backend.scan:
        # Before connecting: that the medium cannot list is known without asking it.
        raise ConfigError(f"{url}: {cls.scheme}:// cannot be inspected: it cannot list what it stores"
                          f"{cls.cannot_list_because}")
    if not cls.capabilities.shared_across_processes:
        raise ConfigError(f"{url}: a {cls.scheme}:// store lives inside one process, so a new one is empty; "
                          f"inspect it in-process with tiered_kv.ops.store_inspect.inspect_backend(backend)")
    return cls.open_for_reading(url)


async def _inspect_url(url: str, verify: bool, key: RecordKey | None = None) -> Inspection:
    from ..backends.url_options import split_url

    backend = open_for_inspection(url)
    async with backend:
        return await inspect_backend(backend, verify=verify, label=split_url(url)._replace(query="").geturl(),
                                     record_key=key)


def secret_from_environment() -> RecordKey | None:
    """The record key of ``$TIERED_KV_SECURITY__SECRET``, or None where it is unset or empty."""
    try:
        return make_record_key(os.environ.get(SECRET_ENV))
    except ConfigError as exc:
        raise ConfigError(f"{SECRET_ENV}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    found = asyncio.run(_inspect_url(args.url, args.verify, secret_from_environment()))
    if args.json:
        print(json.dumps(found.as_json()))
    else:
        print("\n".join(_table(found)))
    return 0 if found.ok else 1


def _table(found: Inspection) -> Iterator[str]:
    checked = "every record verified" if found.verified else "headers read (--verify checks the payloads)"
    scope = "" if found.prefix is None else f" (keys under prefix {found.prefix!r})"
    yield f"store {found.backend}{scope}: {found.records:,} records, {format_size(found.bytes)} ({found.bytes:,} B); {checked}"
    if found.specs:
        yield f"{'spec fingerprint':<34}{'records':>10}{'bytes':>18}{'payload B':>14}"
        for fp, c in sorted(found.specs.items()):
            yield f"{fp:<34}{c.records:>10,}{c.bytes:>18,}{c.payload_bytes:>14,}"
    if found.without_spec:
        yield f"{found.without_spec:,} records under no spec fingerprint (their header does not parse)"
    if found.vanished:
        yield f"{found.vanished:,} listed objects were gone before they were read (evicted or deleted meanwhile)"
    for key_id, count in sorted(found.key_ids.items()):
        yield f"{count:,} records keyed with secret {key_id}"
    if found.unverified:
        yield f"{found.unverified:,} keyed records not verified: their secret is not in ${SECRET_ENV}"
    for f in found.not_records:
        yield f"not a record: {f.name}: {f.reason}"
    if found.corrupt:
        yield f"{len(found.corrupt):,} corrupt:"
        for f in found.corrupt:
            yield f"  {f.name}{f' (page {f.key[:64]!r})' if f.key and f.key != f.name else ''}: {f.reason}"
    else:
        yield "no corrupt records"
