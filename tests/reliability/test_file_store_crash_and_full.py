"""A file store whose writer is killed (SIGKILL) in the middle of its puts, and one whose
filesystem is full.

After the kill no half page sits under a page name: every record under a page name verifies (a
put writes a temp file and links it to its name only once written), and a replay over the store
serves every request right. On a full filesystem puts are refused and counted, reads go on, the
tier never degrades, and every request is served right."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tiered_kv.backends import open_backend
from tiered_kv.ops.replay import synthetic_chat
from tiered_kv.ops.store_inspect import inspect_backend

from ..ops.replay.conftest import TINY_CHAT
from .conftest import guarded_replay, report

ROOT = Path(__file__).resolve().parents[2]

#: Replays chat after chat over one file store, forever: every new page is a put.
_WRITER = textwrap.dedent("""
    import dataclasses, sys
    sys.path.insert(0, {root!r})
    from tests.ops.replay.conftest import TEST_SPEC, TINY_CHAT, TINY_TIERS
    from tiered_kv.compose import build, embedded_default
    from tiered_kv.ops.replay import replay, synthetic_chat
    h = build(embedded_default(spec=TEST_SPEC, l3_url={url!r}, **{{**TINY_TIERS, "l3_pages": 100000}}))
    seed = 0
    while True:
        seed += 1
        replay(h, synthetic_chat(dataclasses.replace(TINY_CHAT, seed=seed)))
        print("chat", seed, flush=True)
""")


def _page_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.page") if p.is_file()]


def test_a_writer_killed_mid_put_leaves_no_half_page(tmp_path):
    root = tmp_path / "l3"
    url = f"file://{root}"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=str(ROOT), url=url)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "TRITON_INTERPRET": "1"})
    try:
        deadline = time.monotonic() + 60
        while len(_page_files(root)) < 150:  # past the first chat: puts go on all the time
            assert writer.poll() is None, "the writer died on its own"
            assert time.monotonic() < deadline, "the writer stored too few pages"
            time.sleep(0.01)
        time.sleep(0.137)  # anywhere inside a put
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        writer.stdout.close()

    async def check():
        async with open_backend(url, None) as backend:
            return await inspect_backend(backend, verify=True)
    found = asyncio.run(check())
    temps = [p for p in root.rglob(".tmp-*")]
    assert found.records == len(_page_files(root)) > 0
    assert found.corrupt == [] and found.not_records == [], found.as_json()
    # The store goes on serving: the first chat's pages are read back, right.
    run = guarded_replay(synthetic_chat(TINY_CHAT), url)
    assert run.l3_hit_tokens > 0 and run.backend.corrupt == 0
    report({"records_after_kill": found.records, "corrupt": len(found.corrupt), "temp_files_left": len(temps),
            "l3_hit_tokens_after": run.l3_hit_tokens})


@pytest.fixture
def small_filesystem(tmp_path):
    """A 1 MiB tmpfs (needs root), else skip: room for about 30 of the test spec's pages."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_filesystem_refuses_puts_and_goes_on_serving(small_filesystem):
    url = f"file://{small_filesystem / 'l3'}?fsync=false"
    run = guarded_replay(synthetic_chat(TINY_CHAT), url)
    assert run.summary["l3_degraded_episodes"] == 0 and run.backend.errors == 0
    assert run.backend.puts > 0 and run.backend.put_rejected > 0  # some fit, the rest were refused
    again = guarded_replay(synthetic_chat(TINY_CHAT), url)  # what fitted is read back, right
    assert again.summary["l3_degraded_episodes"] == 0 and again.l3_hit_tokens > 0
    report({"requests": run.summary["requests"], "pages_wrong": run.summary["pages_wrong"],
            "puts": run.backend.puts, "puts_refused": run.backend.put_rejected,
            "l3_hit_tokens_next_replay": again.l3_hit_tokens})
