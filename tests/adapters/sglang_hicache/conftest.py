"""Fixtures for the HiCache backend tests: SGLang imported and its server arguments published once,
and backends attached to fresh host pools, closed afterwards.

Without sglang these tests skip, unless ``REQUIRE_ENGINE_TESTS`` names sglang: then a missing sglang
is an error.
"""

from __future__ import annotations

import os

import pytest

from . import pools as sgl


@pytest.fixture(scope="session")
def sglang_model(tmp_path_factory):
    """The directory of the two-layer model config, with SGLang's arguments published for it."""
    if "sglang" not in os.environ.get("REQUIRE_ENGINE_TESTS", ""):
        pytest.importorskip("sglang.srt.server_args")
    model = tmp_path_factory.mktemp("tiny-llama")
    sgl.publish_args(model)
    return model


@pytest.fixture
def make_backend(sglang_model):
    """``make_backend(kind, layout, url, **options) -> (backend, pools)``: fresh host pools of SGLang
    and our backend attached to them by SGLang's factory; every backend is closed afterwards, and its
    staging pool must have every slot free."""
    made = []

    def make(kind: str, layout: str, url: str, **options):
        pools = sgl.host_pools(kind, layout)
        backend = sgl.attach(pools, sgl.storage_config(kind, url, **options))
        made.append(backend)
        return backend, pools

    yield make
    held = []
    for backend in made:
        staging = None if backend._pages is None else backend._pages.staging.pool
        if staging is not None:
            staging.reap()
            held += [staging.num_slots - staging.free_slots] if staging.free_slots != staging.num_slots else []
        backend.close()
    assert not held, f"staging slots still held after the calls returned: {held}"
