"""The stateful suite's simulated L3 and its worker side for a child process.

``SimL3`` is a key-only L3 that remembers which page's bytes each key holds, writing into a shadow
map "slot -> page" as a real read lands in a slot. ``sim_worker`` builds the same thing as the
worker side of a ``PipeLink`` (an ``L3Controller`` over a ``SimL3``, no L1): the shadow map then
lives in the child, with calls to land a store's bytes in it, read it, read L3 and drop a page
from L3 behind the library's back.
"""

from __future__ import annotations

import asyncio
from typing import Any


class SimL3:
    """Key-only L3: remembers which page's bytes each key holds; reads land after a delay."""

    def __init__(self, shadow: dict[int, str]) -> None:
        self.shadow = shadow
        self.store: dict[str, str] = {}

    async def exists(self, keys):
        run = 0
        for k in keys:
            if k not in self.store:
                break
            run += 1
        return run

    async def get_into(self, keys, slots):
        await asyncio.sleep(0.001)
        out = []
        for k, s in zip(keys, slots):
            if k not in self.store or (out and not out[-1]):
                out.append(False)
                continue
            self.shadow[s] = self.store[k]
            out.append(True)
        return out

    async def put_from(self, keys, slots):
        await asyncio.sleep(0.0005)
        for k, s in zip(keys, slots):
            self.store.setdefault(k, self.shadow.get(s))
        return [True] * len(keys)

    async def delete(self, keys):
        for k in keys:
            self.store.pop(k, None)

    async def aclose(self):
        pass


def sim_worker(limits: Any) -> Any:
    """The worker side of the stateful suite in a child process (see the module docstring)."""
    from tiered_kv.hierarchy import L3Controller
    from tiered_kv.hierarchy.job_worker import JobWorker
    from tiered_kv.hierarchy.process_link import WorkerParts

    shadow: dict[int, str] = {}
    sim = SimL3(shadow)
    controller = L3Controller(sim, record_bytes=1, limits=limits)

    def on_loop(fn, *args):  # the maps are the controller loop's (reads land there): touch them there
        return asyncio.run_coroutine_threadsafe(_call(fn, *args), controller._loop).result(10)

    calls = {
        "land": lambda slots, keys: on_loop(shadow.update, zip(slots, keys)),
        "shadow": lambda: on_loop(dict, shadow),
        "l3_store": lambda: on_loop(dict, sim.store),
        "l3_drop": lambda key: on_loop(sim.store.pop, key, None),
        "controller_stats": lambda: controller.stats,
    }
    return WorkerParts(JobWorker(None, controller), calls)


async def _call(fn, *args):
    return fn(*args)
