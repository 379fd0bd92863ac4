"""A stateful property test of the index and the manager against a simple model.

The L2 is a bare ``SlotAllocator`` (the scheduler-side setup: no host memory) plus a shadow map
"slot -> which page's bytes it holds"; L3 is a key-only simulated tier on the controller's loop
whose reads write into the shadow map after a delay (as a real read lands in a slot). The model
knows which pages were ever stored. Hypothesis drives stores (some failing, some with copies
still in flight), requests with prefetches, aborts, L3 deletions behind the library's back, L1
hits and copy completions, and checks after every step:

- no slot is free while a copy may still touch it (a load or failed store not completed);
- every resident page's slot holds that page's bytes, and L3 holds each page's own bytes, so no
  page is on two tiers with different contents; no two pages share a slot;
- a lookup never claims more than was inserted, and what a load hands out has the right bytes;
- free + deferred + resident + storing + prefetch-held == num_slots.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tiered_kv.hierarchy import CacheManager, ControllerLimits, L3Controller, Policies, WritePolicy
from tiered_kv.model.slot_allocator import SlotAllocator

from .conftest import PAGE, assert_clean, keys_of, prompts
from .stateful_sim import SimL3, sim_worker

CHAINS = [keys_of(t) for t in prompts(21, [6, 6, 5, 4], shared=2)]
NUM_SLOTS = 10
LIMITS = ControllerLimits(read_workers=2, write_workers=1)


class Flag:
    def __init__(self) -> None:
        self.is_done = False

    def done(self) -> bool:
        return self.is_done


class HierarchyMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = SlotAllocator(NUM_SLOTS)
        self.policy = WritePolicy.WRITE_THROUGH
        self.mgr = CacheManager(self.alloc, page_size=PAGE, policies=Policies(write=self.policy), l3=self.open_l3(),
                                max_prefetch_slots=NUM_SLOTS // 2)
        self.inserted: set[str] = set()
        self.copies: list[tuple[Flag, list[int]]] = []  # copies in flight and the slots they touch
        self.prefetching: set[int] = set()
        self.next_rid = 0

    # --- the worker side: L2's bytes (the shadow map) and L3 ----------------------------------
    def open_l3(self):
        """What the manager is given as L3; sets ``self.ctl`` (checked at teardown)."""
        self.shadow: dict[int, str] = {}
        self.sim = SimL3(self.shadow)
        self.ctl = L3Controller(self.sim, record_bytes=1, limits=LIMITS)
        return self.ctl

    def land(self, slots, keys) -> None:
        """A store's copy L1 -> L2 lands: ``slots`` hold ``keys``' bytes."""
        self.shadow.update(zip(slots, keys))

    def shadow_now(self) -> dict[int, str]:
        return self.shadow

    def l3_now(self) -> dict[str, str]:
        return dict(self.sim.store)

    def l3_drop(self, key: str) -> None:
        self.ctl._loop.call_soon_threadsafe(self.sim.store.pop, key, None)

    # --- rules -------------------------------------------------------------------------------
    @rule(chain=st.integers(0, len(CHAINS) - 1), n=st.integers(1, 6), fail=st.lists(st.booleans(), max_size=6),
          in_flight=st.booleans())
    def store(self, chain, n, fail, in_flight):
        keys = CHAINS[chain][:n]
        plan = self.mgr.prepare_store(keys)
        flags = [not (fail[i] if i < len(fail) else False) for i in range(len(plan))]
        self.land(plan.slots, plan.keys)  # the worker's copy L1 -> L2 lands
        done = Flag()
        if in_flight:
            # a failed page's slot may still be written by its copy: track it until done
            self.copies.append((done, [(s, None) for s, ok in zip(plan.slots, flags) if not ok]))
        else:
            done.is_done = True
        self.mgr.complete_store(plan, flags, completion=done)
        self.inserted.update(k for k, ok in zip(plan.keys, flags) if ok)

    @rule(chain=st.integers(0, len(CHAINS) - 1), n=st.integers(1, 6), l1=st.integers(0, 3),
          wait=st.booleans(), abort=st.booleans())
    def request(self, chain, n, l1, wait, abort):
        keys = CHAINS[chain][:n]
        l1 = min(l1, len(keys))
        rid = self.next_rid
        self.next_rid += 1
        deadline = time.monotonic() + 10
        while (m := self.mgr.lookup(rid, keys, l1)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.0002)
        hit = keys[l1:l1 + m.l2_pages + m.l3_pages]
        assert m.l1_pages == l1 and set(hit) <= self.inserted, "a hit beyond what was inserted"
        self.mgr.start_prefetch(rid, keys, m)
        if abort:
            self.mgr.abort(rid)
            return
        if wait:
            while not self.mgr.prefetch_done(rid):
                assert time.monotonic() < deadline
                time.sleep(0.0002)
        plan = self.mgr.prepare_load(hit, rid)
        assert plan.keys == hit[:len(plan)]
        shadow = self.shadow_now()
        for k, s in zip(plan.keys, plan.slots):
            assert shadow.get(s) == k, "a load would read another page's bytes"
        done = Flag()
        self.copies.append((done, list(zip(plan.slots, plan.keys))))
        self.mgr.complete_load(plan, done)

    @rule(chain=st.integers(0, len(CHAINS) - 1), n=st.integers(1, 6))
    def l1_hit(self, chain, n):
        self.mgr.on_l1_hit(CHAINS[chain][:n])

    @rule(chain=st.integers(0, len(CHAINS) - 1), i=st.integers(0, 5))
    def l3_loses_a_page(self, chain, i):
        key = CHAINS[chain][min(i, len(CHAINS[chain]) - 1)]
        self.l3_drop(key)

    @precondition(lambda self: self.copies)
    @rule(data=st.data())
    def a_copy_completes(self, data):
        i = data.draw(st.integers(0, len(self.copies) - 1))
        flag, _ = self.copies.pop(i)
        flag.is_done = True

    @rule()
    def settle(self):
        assert self.mgr.wait_idle(10)

    # --- invariants --------------------------------------------------------------------------
    @invariant()
    def consistent(self):
        self.mgr.poll()
        shadow = self.shadow_now()
        free = {s for a, b in self.alloc.runs() for s in range(a, b)}
        busy: dict[int, str | None] = {}
        for flag, touched in self.copies:
            if not flag.done():
                for slot, key in touched:
                    assert slot not in free, "a slot was freed while a copy may still touch it"
                    # a load still reads the page: nothing may have overwritten the slot
                    assert key is None or shadow.get(slot) == key, "a slot was reused under a load"
                    busy[slot] = key
        index = self.mgr.index
        owners: dict[int, str] = {}
        storing = resident = 0
        for key, e in list(index.entries.items()):
            if e.state is None:
                continue
            assert e.slot not in free, "a page's slot is free"
            assert e.slot not in owners, "two pages share a slot"
            assert busy.get(e.slot, key) == key, "a failed store's slot was reused while its copy may write"
            owners[e.slot] = key
            if e.state == "resident":
                resident += 1
                assert shadow.get(e.slot) == key, "L2 holds another page's bytes"
            else:
                storing += 1
        for key, holds in self.l3_now().items():
            assert holds == key, "L3 holds another page's bytes"
        held = sum(len(p.slots) for p in self.mgr._prefetches.values() if p.future is not None)
        assert self.alloc.free_count + self.alloc.pending_count + resident + storing + held == NUM_SLOTS

    def teardown(self):
        for flag, _ in self.copies:
            flag.is_done = True
        self.mgr.close()
        assert_clean(self.alloc, self.ctl)


HierarchyMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestHierarchy = HierarchyMachine.TestCase


class SplitHierarchyMachine(HierarchyMachine):
    """The same rules and checks with the worker side (the shadow map, L3's controller) in a child
    process over a ``PipeLink``: every L3 call a job over the pipe, every answer a result back."""

    def open_l3(self):
        from tiered_kv.hierarchy.l3_jobs import L3Jobs
        from tiered_kv.hierarchy.process_link import ChildController, PipeLink

        self.link = PipeLink(sim_worker, LIMITS)
        jobs = L3Jobs(self.link, limits=LIMITS)
        self.ctl = ChildController(jobs)
        return jobs

    def land(self, slots, keys) -> None:
        self.link.call("land", list(slots), list(keys))

    def shadow_now(self) -> dict[int, str]:
        return self.link.call("shadow")

    def l3_now(self) -> dict[str, str]:
        return self.link.call("l3_store")

    def l3_drop(self, key: str) -> None:
        self.link.call("l3_drop", key)

    def teardown(self):
        super().teardown()
        assert self.mgr.l3.in_flight() == 0 and not self.mgr.l3.lost
        assert self.link.process.exitcode == 0


# A child process per example (about 0.1 s to start on a 2-core VM): the same bound as in one process.
SplitHierarchyMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None,
                                                   suppress_health_check=[HealthCheck.too_slow])
TestHierarchyTwoProcesses = SplitHierarchyMachine.TestCase
