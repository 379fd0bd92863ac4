"""A file store that turns read-only after open (a filesystem remounted read-only after errors):
a replay goes on serving every page it holds from L3, its refused puts are counted, the tier never
degrades, and once the store is writable again puts store."""

from __future__ import annotations

import contextlib
import dataclasses

from tiered_kv.ops.replay import synthetic_chat

from ..backends.unwritable import frozen
from ..ops.replay.conftest import PAGE, TINY_CHAT
from .conftest import guarded_replay, one_after_another, report

#: Another chat, whose pages the store does not hold: each of them is a put.
OTHER_CHAT = dataclasses.replace(TINY_CHAT, seed=TINY_CHAT.seed + 1)


def test_a_store_that_turns_read_only_serves_reads_and_refuses_puts(tmp_path):
    root = tmp_path / "l3"
    url = f"file://{root}?fsync=false"
    guarded_replay(synthetic_chat(TINY_CHAT), url)  # fills the store
    intact = guarded_replay(synthetic_chat(TINY_CHAT), url)
    assert intact.l3_hit_tokens > 0
    held = len(synthetic_chat(TINY_CHAT))
    # The chat the store holds, then one it does not: reads first, then puts, on one open store.
    requests = one_after_another(synthetic_chat(TINY_CHAT), synthetic_chat(OTHER_CHAT))
    with contextlib.ExitStack() as stack:
        run = guarded_replay(requests, url, inject=lambda _h: stack.enter_context(frozen(root)))
    assert run.summary["l3_degraded_episodes"] == 0 and run.backend.errors == 0
    read_back = sum(r.l3_pages for r in run.requests[:held]) * PAGE
    assert read_back == intact.l3_hit_tokens  # every page it holds, read from L3
    assert run.backend.put_rejected > 0 and run.backend.puts == 0
    after = guarded_replay(synthetic_chat(OTHER_CHAT), url)
    assert after.backend.puts > 0 and after.backend.put_rejected == 0
    report({"requests": run.summary["requests"], "pages_wrong": run.summary["pages_wrong"],
                                "l3_hit_tokens": [intact.l3_hit_tokens, read_back],
                                "puts_refused": run.backend.put_rejected})
