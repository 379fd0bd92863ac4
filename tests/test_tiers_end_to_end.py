"""All three tiers together on the CPU: engine pages -> host slots -> file L3 -> other host slots
-> other engine pages, bit-exact, through the transfer engine and a real directory; and a page whose
stored record is damaged comes back as a miss, never as data in the engine's pool."""

from __future__ import annotations

import random

import torch

from tiered_kv import HostPool, allocate_engine_like, nsa_spec
from tiered_kv.backends import open_backend
from tiered_kv.transfers.engine import TransferEngine

SPEC = nsa_spec(num_layers=3)


def fill(pool) -> None:
    for ci in range(len(pool.spec.components)):
        for layer in range(pool.spec.num_layers):
            view = pool.chunk_view(ci, layer)
            view.copy_(torch.randint(0, 256, view.shape, dtype=torch.uint8))


def page_bytes(pool, page: int) -> list[torch.Tensor]:
    return [pool.chunk_view(ci, layer)[page].clone()
            for ci in range(len(pool.spec.components)) for layer in range(pool.spec.num_layers)]


async def test_pages_travel_l1_l2_l3_l2_l1(tmp_path):
    writer_l1, reader_l1 = allocate_engine_like(SPEC, 16), allocate_engine_like(SPEC, 16)
    fill(writer_l1)
    for ci in range(2):
        for layer in range(3):
            reader_l1.chunk_view(ci, layer).fill_(0xA5)
    pages = random.sample(range(1, 16), 5)
    keys = [f"prefix-{i}-{random.getrandbits(64):016x}" for i in range(5)]
    with HostPool(SPEC, 8, "layer_first") as staging, HostPool(SPEC, 8, "page_first") as writer_l2, \
            HostPool(SPEC, 8, "page_first") as reader_l2:
        # The writer: backup into page_first slots, seal, put.
        slots = writer_l2.allocate(5)
        backup = TransferEngine(writer_l1, writer_l2).backup(pages, slots)
        assert backup.done()
        for slot, key in zip(slots, keys):
            writer_l2.seal(slot, key)
        async with open_backend(f"file://{tmp_path}", writer_l2) as l3:
            assert await l3.put_from(keys, slots) == [True] * 5
        writer_l2.free(slots, backup)
        # Damage the third page on disk: it and everything after it in the prefix must miss.
        async with open_backend(f"file://{tmp_path}", reader_l2) as l3:
            damaged = l3.path_of(keys[2])
            data = bytearray(damaged.read_bytes())
            data[4096 + 100] ^= 0xFF
            damaged.write_bytes(data)
            assert await l3.exists(keys) == 5  # present, not yet verified
            dst = reader_l2.allocate(5)
            hits = await l3.get_into(keys, dst)
            assert hits == [True, True, False, False, False]
            assert l3.stats.corrupt == 1 and await l3.exists(keys) == 2
        # The reader loads only the verified leading run, layer by layer.
        run = hits.index(False)
        targets = random.sample(range(1, 16), run)
        load = TransferEngine(reader_l1, reader_l2).load(dst[:run], targets)
        for layer in range(SPEC.num_layers):
            load.wait_layer(layer)
        for src, got in zip(pages[:run], targets):
            assert all(torch.equal(a, b) for a, b in zip(page_bytes(writer_l1, src), page_bytes(reader_l1, got)))
        untouched = [p for p in range(16) if p not in targets]
        for ci in range(2):
            for layer in range(3):
                assert bool((reader_l1.chunk_view(ci, layer)[untouched] == 0xA5).all())
        # A layer_first pool gets the same page through an encoded record.
        record = reader_l2.encode_record(dst[0], keys[0])
        staging.decode_record(0, record, keys[0])
        for ci in range(2):
            for layer in range(3):
                assert torch.equal(staging.chunk_view(ci, layer)[0], writer_l1.chunk_view(ci, layer)[pages[0]])
