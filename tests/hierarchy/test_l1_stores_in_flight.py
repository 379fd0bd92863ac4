"""L1 evictions while the stores of the evicted pages are still copying (a GPU's backups in
flight): ``L1PrefixCache`` waits for them before it reuses the pages, and every store it waited
for is handed to the manager, so its pages become resident on L2. The worker's stores here stay
in flight until they are synchronized, as a GPU backup stays until its event completes; the
bytes are real copies through the torch engine."""

from __future__ import annotations

from tiered_kv import HostPool, allocate_engine_like
from tiered_kv.hierarchy import CacheManager, L1PrefixCache, Policies, TransferHalf
from tiered_kv.hierarchy.index import RESIDENT
from tiered_kv.hierarchy.oracle import fill_pages, verify_pages

from .conftest import SPEC, assert_clean, keys_of, prompts


class _InFlight:
    """A backup handle that reads as running until someone synchronizes on it."""

    def __init__(self, handle) -> None:
        self.handle, self.synced = handle, False

    def done(self) -> bool:
        return self.synced

    def synchronize(self) -> None:
        self.handle.synchronize()
        self.synced = True


class StoresInFlight(TransferHalf):
    def store(self, plan, device_pages):
        completion = super().store(plan, device_pages)
        if not len(plan):
            return completion
        plan_, handle = self._stores[-1]
        self._stores[-1] = (plan_, _InFlight(handle))
        return self._stores[-1][1]


def test_stores_waited_for_on_eviction_become_resident_on_l2():
    a, b = (keys_of(p) for p in prompts(7, [4, 4]))
    host = HostPool(SPEC, 16)
    manager = CacheManager(host, page_size=SPEC.page_size, policies=Policies(write="write_through"))
    device = allocate_engine_like(SPEC, 5)  # 4 usable pages: B must evict all of A
    worker = StoresInFlight(device, host)
    l1 = L1PrefixCache(device.num_pages, manager, worker, reserved=device.reserved_pages,
                       fill=lambda k, p: fill_pages(device, k, p), verify=lambda k, p: verify_pages(device, k, p))
    try:
        for rid, keys in ((0, a), (1, b)):
            assert l1.lookup(rid, keys) is not None
            l1.start(rid)
            served = l1.run(rid)
            assert served.computed_pages == 4 and served.wrong_pages == 0
        # A's stores were still copying when B needed its pages: the cache waited for them, and
        # the manager has them: A is on L2, whole, and loads back with every byte right.
        assert all(manager.index.entry(k).state == RESIDENT for k in a)
        assert manager.index.l2_run(a) == 4
        assert l1.lookup(2, a) is not None
        l1.start(2)
        again = l1.run(2)
        assert (again.l2_pages, again.computed_pages, again.wrong_pages) == (4, 0, 0)
        assert again.verified_pages == 4
    finally:
        l1.close()
    assert_clean(host, None)
