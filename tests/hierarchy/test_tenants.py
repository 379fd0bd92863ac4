"""Tenants sharing one file L3 through whole hierarchies (``tiered_kv.compose``), as the replay builds them.

A tenant is its namespace salt and its secret (``ReplaySettings.tenant`` / ``record_key``, from
``security.tenant`` / ``security.secret``). A second instance of the same tenant hits the first
one's pages on L3; another tenant, or an instance with the tenant's salt but not its secret, gets
none of them, and what it refused stays on L3 for the tenant.
"""

from __future__ import annotations

import secrets

import pytest

from tests.ops.replay.conftest import TEST_SPEC, TINY_CHAT, close_checked
from tiered_kv.compose import build, embedded_default
from tiered_kv.config import load_config, to_replay_settings
from tiered_kv.model.record_key import RecordKey
from tiered_kv.ops.replay import replay, synthetic_chat

ALICE_SECRET = secrets.token_hex(32)


def run(url: str, requests, *, tenant: str, record_key: RecordKey | None) -> tuple[list, dict]:
    """Replay ``requests`` on a fresh hierarchy over ``url``; (per-request results, backend counters)."""
    h = build(embedded_default(spec=TEST_SPEC, l1_pages=20, l2_pages=40, l3_pages=256, l3_url=url,
                               tenant=tenant, record_key=record_key))
    try:
        assert h.host_pool.record_key == record_key
        result = replay(h, requests, inflight=4)
        stats = vars(h.controller.backend.stats).copy()
    finally:
        close_checked(h)
    return result.requests, stats


@pytest.fixture
def filled(tmp_path):
    """A file L3 that Alice's first instance filled with the chat's pages."""
    url = f"file://{tmp_path / 'shared-l3'}?fsync=false"
    requests = synthetic_chat(TINY_CHAT)
    served, stats = run(url, requests, tenant="alice", record_key=RecordKey(ALICE_SECRET))
    assert sum(r.wrong_pages for r in served) == 0 and stats["puts"] > 0
    return url, requests[:1]


def test_a_second_instance_of_the_tenant_hits_its_pages(filled):
    url, first = filled
    [served], stats = run(url, first, tenant="alice", record_key=RecordKey(ALICE_SECRET))
    assert served.l3_pages > 0 and served.wrong_pages == 0 and served.verified_pages == served.pages - served.computed_pages
    assert (stats["forged"], stats["foreign"], stats["corrupt"]) == (0, 0, 0)


def test_another_tenant_gets_none_of_its_pages(filled):
    url, first = filled
    [served], stats = run(url, first, tenant="bob", record_key=RecordKey(secrets.token_hex(32)))
    assert served.l3_pages == 0 and served.computed_pages == served.pages
    assert (stats["hits"], stats["forged"], stats["foreign"]) == (0, 0, 0)  # its keys name none of Alice's pages


@pytest.mark.parametrize("record_key", [None, RecordKey(secrets.token_hex(32))], ids=["no_secret", "other_secret"])
def test_the_tenants_salt_without_its_secret_gets_none_and_leaves_them(filled, record_key):
    url, first = filled
    [served], stats = run(url, first, tenant="alice", record_key=record_key)
    assert served.l3_pages == 0 and served.computed_pages == served.pages
    assert stats["hits"] == 0 and stats["foreign"] > 0 and stats["forged"] == 0
    [again], _ = run(url, first, tenant="alice", record_key=RecordKey(ALICE_SECRET))
    assert again.l3_pages > 0 and again.wrong_pages == 0  # the refused records are still Alice's


def test_the_config_gives_the_tenant_and_its_secret_to_the_hierarchy(tmp_path):
    env = {"TIERED_KV_SECURITY__SECRET": ALICE_SECRET, "TIERED_KV_SECURITY__TENANT": "alice"}
    settings = to_replay_settings(load_config(overrides={"l3.url": f"file://{tmp_path}/l3", "spec.layers": 2}, env=env))
    assert settings.tenant == "alice" and settings.record_key == RecordKey(ALICE_SECRET)
    assert ALICE_SECRET not in repr(settings)
    plain = to_replay_settings(load_config(overrides={"l3.url": f"file://{tmp_path}/l3", "spec.layers": 2}, env={}))
    assert plain.tenant == "" and plain.record_key is None
