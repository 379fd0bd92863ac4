"""``tiered-kv inspect URL [--verify]``: records per spec, corrupt ones found, and nothing changed.

Stores of two specs are written through the real backends (file on disk, a real redis-server,
memory in-process), then damaged the way media damage them (a flipped byte in a file, SETRANGE in
Redis); inspect must count, find and list, exit 1 on damage, and leave every byte where it was.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
from pathlib import Path

import pytest
import redis

from tiered_kv import HostPool, mla_spec
from tiered_kv.backends import open_backend
from tiered_kv.backends.memory import MemoryBackend, MemoryOptions
from tiered_kv.ops.cli import main
from tiered_kv.ops.store_inspect import inspect_backend
from tiered_kv.model.record import HEADER_BYTES

from ..backends.contract import SPEC, assert_settled, fill_and_seal, new_keys
from ..backends.redis_server import RedisServer

OTHER_SPEC = mla_spec(num_layers=2, page_size=16)  # another fingerprint and payload length


async def _write(url: str, counts: dict, **options) -> dict[str, dict[str, bytes]]:
    """``counts[spec]`` pages of each spec stored under ``url``; fingerprint -> key -> record."""
    written: dict[str, dict[str, bytes]] = {}
    for spec, n in counts.items():
        with HostPool(spec, n, "page_first") as pool:
            async with open_backend(url, pool, **options) as backend:
                keys = new_keys(n)
                slots = pool.allocate(n)
                written[spec.fingerprint] = fill_and_seal(pool, slots, keys)
                assert await backend.put_from(keys, slots) == [True] * n
                pool.free(slots)
    return written


def _inspect(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["inspect", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _snapshot(root: Path) -> dict[str, tuple[int, float, str]]:
    """Every file under ``root``: size, mtime, sha-256 (what 'changed nothing' means on disk)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# --- file:// ------------------------------------------------------------------------------------
@pytest.fixture
def file_store(tmp_path):
    root = tmp_path / "kv"
    written = asyncio.run(_write(f"file://{root}", {SPEC: 3, OTHER_SPEC: 2}))
    return root, written


def _page_files(root: Path) -> dict[str, Path]:
    """Page key -> its file, read from each file's header (the names are hashes)."""
    from tiered_kv.model.record import read_header

    return {read_header(p.read_bytes()[:HEADER_BYTES]).key: p for p in root.rglob("*.page")}


def test_file_store_counts_records_per_spec(file_store, capsys):
    root, written = file_store
    code, found = _inspect(capsys, f"file://{root}", "--verify")
    assert code == 0
    files = list(root.rglob("*.page"))
    assert found["records"] == len(files) == 5
    assert found["bytes"] == sum(p.stat().st_size for p in files)
    assert {fp: c["records"] for fp, c in found["specs"].items()} == {fp: len(r) for fp, r in written.items()}
    assert found["specs"][OTHER_SPEC.fingerprint]["payload_bytes"] == OTHER_SPEC.page_bytes
    assert found["corrupt"] == [] and found["verified"] is True


def test_file_flipped_payload_byte_is_found_by_verify_and_left_in_place(file_store, capsys):
    root, written = file_store
    victim_key = next(iter(written[OTHER_SPEC.fingerprint]))
    victim = _page_files(root)[victim_key]
    _flip(victim, HEADER_BYTES + 100)
    before = _snapshot(root)
    # Headers alone are intact: without --verify the payload is not read.
    code, found = _inspect(capsys, f"file://{root}")
    assert code == 0 and found["corrupt"] == [] and found["verified"] is False
    code, found = _inspect(capsys, f"file://{root}", "--verify")
    assert code == 1
    assert [(c["name"], c["key"]) for c in found["corrupt"]] == [(str(victim.relative_to(root)), victim_key)]
    assert "payload checksum mismatch" in found["corrupt"][0]["reason"]
    assert found["records"] == 5  # a corrupt record is still counted, and still there
    assert _snapshot(root) == before


def test_file_damaged_header_fails_without_verify_and_table_lists_it(file_store, capsys):
    root, _ = file_store
    victim = next(iter(root.rglob("*.page")))
    _flip(victim, 20)  # inside the spec fingerprint: the header checksum no longer matches
    assert main(["inspect", f"file://{root}"]) == 1
    out = capsys.readouterr().out
    assert "1 corrupt" in out and str(victim.relative_to(root)) in out and "header checksum" in out


def test_json_counts_records_per_spec_as_count_and_names_the_unparsed_ones(file_store, capsys):
    """Count, bytes and records per spec fingerprint: ``count`` beside ``records`` at the
    top and per spec; a header-corrupt record is counted at the top only, and ``without_spec`` says
    how many such records make the difference."""
    root, written = file_store
    code, found = _inspect(capsys, f"file://{root}")
    assert code == 0 and found["count"] == found["records"] == 5 and found["without_spec"] == 0
    assert {fp: c["count"] for fp, c in found["specs"].items()} == {fp: len(r) for fp, r in written.items()}
    assert all(c["count"] == c["records"] for c in found["specs"].values())
    _flip(next(iter(root.rglob("*.page"))), 20)  # the header checksum fails: no fingerprint to count it under
    code, found = _inspect(capsys, f"file://{root}")
    assert code == 1 and found["count"] == found["records"] == 5 and found["without_spec"] == 1
    assert sum(c["count"] for c in found["specs"].values()) == 4
    assert main(["inspect", f"file://{root}"]) == 1
    assert "1 records under no spec fingerprint" in capsys.readouterr().out


def test_file_record_under_another_name_is_corrupt(file_store, capsys):
    root, written = file_store
    files = _page_files(root)
    keys = list(written[SPEC.fingerprint])
    files[keys[1]].write_bytes(files[keys[0]].read_bytes())  # page 0's record under page 1's name
    code, found = _inspect(capsys, f"file://{root}", "--verify")
    assert code == 1
    assert [(c["key"], "stored as" in c["reason"]) for c in found["corrupt"]] == [(keys[0], True)]


def test_file_inspection_changes_nothing(file_store, capsys):
    """Opening for inspection must not trim to a capacity, remove stale temp files or probe."""
    root, _ = file_store
    stale = root / ".tmp-left-by-a-crash"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 10_000, time.time() - 10_000))
    before = _snapshot(root)
    dirs_before = sorted(p for p in root.rglob("*") if p.is_dir())
    code, found = _inspect(capsys, f"file://{root}?capacity_bytes=200KiB&stale_temp_s=1", "--verify")
    assert code == 0 and found["records"] == 5
    assert _snapshot(root) == before
    assert sorted(p for p in root.rglob("*") if p.is_dir()) == dirs_before


def test_file_missing_directory_is_bad_input_and_not_created(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert main(["inspect", f"file://{missing}"]) == 2
    assert "no directory" in capsys.readouterr().err
    assert not missing.exists()


# --- redis:// -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server():
    with RedisServer() as srv:
        yield srv


def test_redis_store_scan_over_the_prefix_finds_setrange_damage(server, capsys):
    prefix = f"t{secrets.token_hex(4)}:"
    url = f"{server.url}?prefix={prefix}"
    written = asyncio.run(_write(url, {SPEC: 2, OTHER_SPEC: 3}))
    client = redis.Redis(host="127.0.0.1", port=server.port)
    # Outside the prefix (another cache's namespace): not ours to count, even when broken.
    client.set(f"other{secrets.token_hex(4)}:x", b"garbage")
    client.rpush(f"{prefix}a-list", b"someone else's")  # under the prefix but no byte value
    code, found = _inspect(capsys, url, "--verify")
    assert code == 0
    assert {fp: c["records"] for fp, c in found["specs"].items()} == {fp: len(r) for fp, r in written.items()}
    assert found["records"] == 5
    assert found["bytes"] == sum(len(r) for records in written.values() for r in records.values())
    assert [n["name"] for n in found["not_records"]] == ["a-list"]

    victim = list(written[SPEC.fingerprint])[1]
    client.setrange(f"{prefix}{victim}", HEADER_BYTES + 7, b"\x00\x01\x02")
    values_before = {k: client.dump(k) for k in client.scan_iter(match=f"{prefix}*")}
    code, found = _inspect(capsys, url, "--verify")
    assert code == 1
    assert [(c["name"], c["key"]) for c in found["corrupt"]] == [(victim, victim)]
    assert {k: client.dump(k) for k in client.scan_iter(match=f"{prefix}*")} == values_before  # nothing deleted
    code, found = _inspect(capsys, url)  # headers only: the damage is in the payload
    assert code == 0 and found["records"] == 5


def test_redis_output_names_the_key_prefix_it_listed(server, capsys):
    """The URL shown drops its query, and a URL without ``prefix`` lists the default ``tkv:``: the
    output says which keys it looked at, in the table and in ``--json``."""
    prefix = f"p{secrets.token_hex(4)}:"
    asyncio.run(_write(f"{server.url}?prefix={prefix}", {SPEC: 1}))
    code, found = _inspect(capsys, f"{server.url}?prefix={prefix}")
    assert code == 0 and found["prefix"] == prefix and found["records"] == 1
    assert main(["inspect", f"{server.url}?prefix={prefix}"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"store {server.url} (keys under prefix '{prefix}'): 1 records"), first
    code, found = _inspect(capsys, server.url)
    assert code == 0 and found["prefix"] == "tkv:"


def test_a_file_store_names_no_prefix(file_store, capsys):
    root, _ = file_store
    code, found = _inspect(capsys, f"file://{root}")
    assert code == 0 and found["prefix"] is None
    assert main(["inspect", f"file://{root}"]) == 0
    assert "prefix" not in capsys.readouterr().out


def test_redis_glob_characters_in_the_prefix_are_literal(server, capsys):
    tag = secrets.token_hex(4)
    asyncio.run(_write(f"{server.url}?prefix=g{tag}*:", {SPEC: 1}))
    asyncio.run(_write(f"{server.url}?prefix=g{tag}x:", {SPEC: 2}))  # would match a glob 'g<tag>*:*'
    code, found = _inspect(capsys, f"{server.url}?prefix=g{tag}*:")
    assert code == 0 and found["records"] == 1


# --- memory:// (in-process) and media that cannot be listed ------------------------------------
async def test_memory_store_in_process_finds_corrupt_and_keeps_it():
    backend = MemoryBackend(None, MemoryOptions(capacity_bytes=64 << 20))
    counts = {SPEC: 3, OTHER_SPEC: 2}
    written: dict[str, dict[str, bytes]] = {}
    for spec, n in counts.items():
        with HostPool(spec, n, "page_first") as pool:
            free_before = pool.free_slots
            async with backend.on_same_store(pool) as writer:
                keys = new_keys(n)
                slots = pool.allocate(n)
                written[spec.fingerprint] = fill_and_seal(pool, slots, keys)
                assert await writer.put_from(keys, slots) == [True] * n
                pool.free(slots)
            assert_settled(pool, free_before)
    found = await inspect_backend(backend, verify=True)
    assert found.ok and found.records == 5
    assert {fp: c.records for fp, c in found.specs.items()} == {fp: len(r) for fp, r in written.items()}

    damaged, long_one = list(written[OTHER_SPEC.fingerprint])
    backend.corrupt_for_tests(damaged, HEADER_BYTES + 3)
    backend.store_for_tests(long_one, written[OTHER_SPEC.fingerprint][long_one] + b"tail")
    found = await inspect_backend(backend, verify=True)
    reasons = {c.key: c.reason for c in found.corrupt}
    assert set(reasons) == {damaged, long_one}
    assert "checksum" in reasons[damaged] and "stored value is" in reasons[long_one]
    assert await backend.exists([damaged, long_one]) == 2  # unlike get_into, inspect deletes nothing
    await backend.aclose()
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    assert pending == []


def test_memory_url_on_the_command_line_is_refused(capsys):
    assert main(["inspect", "memory://"]) == 2
    assert "inside one process" in capsys.readouterr().err


def test_mooncake_cannot_list_and_says_so_without_connecting(capsys):
    # No master listens there: the answer comes before any connection is tried.
    assert main(["inspect", "mooncake://127.0.0.1:9?protocol=tcp"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot list" in err and "mooncake" in err


@pytest.mark.parametrize(("url", "message"), [("nosuch://x", "unknown backend scheme"), ("not-a-url", "scheme://")])
def test_bad_url_exits_2(url, message, capsys):
    assert main(["inspect", url]) == 2
    assert message in capsys.readouterr().err


def test_missing_url_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["inspect"])
    assert exited.value.code == 2
    assert "the following arguments are required: URL" in capsys.readouterr().err


# --- keyed records ------------------------------------------------------------------------------
def test_keyed_records_are_checked_with_the_secret_from_the_environment_only(tmp_path, capsys, monkeypatch):
    """A keyed record's tag is checked with $TIERED_KV_SECURITY__SECRET; without it the record is
    counted unverified (not corrupt), and a tampered one is found only with the secret."""
    from tiered_kv.model.record_key import RecordKey

    secret = secrets.token_hex(32)
    root = tmp_path / "kv"
    with HostPool(SPEC, 2, "page_first", record_key=RecordKey(secret)) as pool:
        async def write() -> dict[str, bytes]:
            async with open_backend(f"file://{root}", pool) as backend:
                keys = new_keys(2)
                slots = pool.allocate(2)
                records = fill_and_seal(pool, slots, keys)
                assert await backend.put_from(keys, slots) == [True, True]
                pool.free(slots)
                return records

        written = asyncio.run(write())
    key_id = RecordKey(secret).key_id.hex()
    victim_key = next(iter(written))
    victim = _page_files(root)[victim_key]
    _flip(victim, HEADER_BYTES + 7)
    before = _snapshot(root)
    monkeypatch.delenv("TIERED_KV_SECURITY__SECRET", raising=False)
    code, found = _inspect(capsys, f"file://{root}", "--verify")
    assert code == 0 and found["corrupt"] == [] and found["unverified"] == 2 and found["key_ids"] == {key_id: 2}
    monkeypatch.setenv("TIERED_KV_SECURITY__SECRET", secret)
    code, found = _inspect(capsys, f"file://{root}", "--verify")
    assert code == 1 and found["unverified"] == 0
    assert [(c["key"], "keyed tag mismatch" in c["reason"]) for c in found["corrupt"]] == [(victim_key, True)]
    assert main(["inspect", f"file://{root}", "--verify"]) == 1
    out = capsys.readouterr().out
    assert f"2 records keyed with secret {key_id}" in out and secret not in out
    monkeypatch.setenv("TIERED_KV_SECURITY__SECRET", "too-short")
    assert main(["inspect", f"file://{root}"]) == 2
    err = capsys.readouterr().err
    assert "TIERED_KV_SECURITY__SECRET" in err and "too-short" not in err
    assert _snapshot(root) == before
