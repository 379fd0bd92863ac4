"""The library's own streams (``kernels.owned_streams``): one owner per stream, none destroyed,
freed streams lent again, priorities clamped as torch's pool clamps them.

On CPU the lender runs with a stand-in maker (handles are counters); on a GPU (marked ``gpu``) a
transfer engine's streams are checked against the streams torch hands out to everyone else.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from tiered_kv.kernels import owned_streams
from tiered_kv.kernels.owned_streams import StreamLease, StreamLender


class FakeMaker:
    """Handles 0x1000, 0x1001, ...; priorities as torch's pool gives them on the H200's range [-5, 0]."""

    LEAST, GREATEST = 0, -5

    def __init__(self) -> None:
        self.made: list[tuple[int, int]] = []  # (device, priority) of each stream made

    def priority(self, device_index: int, priority: int) -> int:
        return owned_streams.torch_pool_priority(priority, self.LEAST, self.GREATEST)

    def make(self, device_index: int, priority: int) -> int:
        self.made.append((device_index, priority))
        return 0x1000 + len(self.made) - 1

    def wrap(self, handle: int, device_index: int):
        return _Wrapped(handle, device_index)


class _Wrapped:
    def __init__(self, handle: int, device_index: int) -> None:
        self.cuda_stream, self.device_index = handle, device_index


def _lender():
    maker = FakeMaker()
    return StreamLender(maker), maker


def test_a_lease_takes_distinct_streams_and_gives_all_back_on_release():
    lender, maker = _lender()
    lease = StreamLease(0, lender)
    streams = [lease.take(), lease.take(), lease.take(-1)]
    assert len({s.cuda_stream for s in streams}) == 3 and len(lease) == 3
    assert lender.lent_count() == 3 and lender.free_count() == 0
    lease.release()
    assert lender.lent_count() == 0 and lender.free_count() == 3 and len(lease) == 0
    lease.release()  # once only
    assert lender.free_count() == 3
    with pytest.raises(RuntimeError, match="released"):
        lease.take()


def test_freed_streams_are_lent_again_by_priority_and_none_is_made_twice():
    lender, maker = _lender()
    first = StreamLease(0, lender)
    low = {first.take(0).cuda_stream for _ in range(2)}
    high = first.take(-100).cuda_stream
    first.release()
    second = StreamLease(0, lender)
    again_high = second.take(-3).cuda_stream  # -100 and -3 are one priority in torch's pool
    again_low = {second.take(0).cuda_stream for _ in range(2)}
    assert again_high == high and again_low == low
    assert lender.made == 3 and maker.made == [(0, 0), (0, 0), (0, -3)]
    third = StreamLease(0, lender)
    assert third.take(0).cuda_stream not in low | {high}  # all lent out: a new one
    assert lender.made == 4


@pytest.mark.parametrize("least, greatest, expected", [
    (0, -5, {-100: -3, -5: -3, -3: -3, -2: -2, -1: -1, 0: 0, 7: 0}),  # H200: torch's 4 levels of 6
    (0, -1, {-100: -1, -1: -1, 0: 0, 3: 0}),  # a device of two levels
    (0, 0, {-100: 0, 0: 0}),  # no priorities at all
])
def test_owned_streams_keep_the_priorities_torchs_pool_gives(least, greatest, expected):
    assert {p: owned_streams.torch_pool_priority(p, least, greatest) for p in expected} == expected


def test_streams_of_other_devices_are_not_mixed():
    lender, _ = _lender()
    lease = StreamLease(0, lender)
    lease.take()
    lease.release()
    other = StreamLease(1, lender)
    stream = other.take()
    assert stream.device_index == 1 and lender.made == 2


def test_a_collected_lease_gives_its_streams_back():
    lender, _ = _lender()
    lease = StreamLease(0, lender)
    handles = {lease.take().cuda_stream for _ in range(4)}
    del lease
    gc.collect()
    assert lender.free_count() == 4 and lender.lent_count() == 0
    assert {StreamLease(0, lender).take().cuda_stream} <= handles


def test_give_back_returns_only_what_this_lease_holds():
    lender, _ = _lender()
    lease, other = StreamLease(0, lender), StreamLease(0, lender)
    mine, theirs = lease.take(), other.take()
    with pytest.raises(ValueError, match="not held by this lease"):
        lease.give_back([theirs])
    lease.give_back([mine])
    assert lender.free_count() == 1 and len(lease) == 0
    with pytest.raises(ValueError, match="not held by this lease"):
        lease.give_back([mine])  # twice
    lease.release()
    assert lender.free_count() == 1 and lender.lent_count() == 1  # the other lease's stream stays lent
    lease.give_back([mine])  # after release: everything went back already, nothing to return


def test_the_lender_refuses_a_stream_given_back_twice():
    lender, _ = _lender()
    handle, key, _ = lender.lend(0, 0)
    lender.take_back([(handle, key)])
    with pytest.raises(ValueError, match="given back twice"):
        lender.take_back([(handle, key)])


def test_concurrent_owners_never_share_a_stream():
    lender, _ = _lender()
    leases = [StreamLease(0, lender) for _ in range(8)]
    taken: list[list[int]] = [[] for _ in leases]
    barrier = threading.Barrier(len(leases))

    def work(i: int) -> None:
        barrier.wait()
        for round_ in range(50):
            stream = leases[i].take(-(round_ % 3))
            taken[i].append(stream.cuda_stream)
            if round_ % 2:
                leases[i].give_back([stream])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held = [set(lease._handles) for lease in leases]
    assert sum(len(h) for h in held) == len(set().union(*held)) == 8 * 25  # no stream held twice
    assert lender.lent_count() == 8 * 25
    for lease in leases:
        lease.release()
    assert lender.lent_count() == 0 and lender.free_count() == lender.made


def test_without_a_runtime_a_lease_hands_out_torch_pool_streams(monkeypatch):
    from tests.fake_cuda import FakeStream, patch_cuda

    patch_cuda(monkeypatch)
    monkeypatch.setattr(owned_streams, "default_lender", lambda: None)
    lease = StreamLease("cuda")
    assert not lease.owned
    stream = lease.take(-1)
    assert isinstance(stream, FakeStream)
    lease.give_back([stream])  # nothing to return
    lease.release()


def test_issue_threads_give_their_streams_back_when_closed(monkeypatch):
    """An engine's replaced or closed issue threads return their streams to its lease."""
    from tests.fake_cuda import patch_cuda
    from tiered_kv.transfers.engine import _IssueThreads

    patch_cuda(monkeypatch)
    lender, _ = _lender()
    lease = StreamLease(0, lender)
    threads = _IssueThreads(torch.device("cuda", 0), 3, -1, lease)
    assert len(lease) == 3 and lender.lent_count() == 3
    threads.close()
    assert len(lease) == 0 and lender.free_count() == 3
    bigger = _IssueThreads(torch.device("cuda", 0), 4, -1, lease)
    assert lender.made == 4  # three lent again, one new
    bigger.close()


def test_an_engine_dropped_without_close_ends_its_threads_and_its_streams_go_back(monkeypatch):
    from tests.fake_cuda import patch_cuda
    from tests.kernels.pools import make_device_pool, make_host_pool
    from tiered_kv import nsa_spec
    from tiered_kv.transfers.engine import TransferEngine

    patch_cuda(monkeypatch)
    lender, _ = _lender()
    spec = nsa_spec(num_layers=2, page_size=4)
    engine = TransferEngine(make_device_pool(spec, 8, "cpu").pool, make_host_pool(spec, 8, "page_first"))
    engine._streams = StreamLease(0, lender)  # stand-in streams for the engine's lease
    threads = engine._issue_threads(3)._threads
    engine._issue_threads(4)  # grown: the three threads before are closed now
    threads += engine._issuer._threads
    assert [t.is_alive() for t in threads] == [False] * 3 + [True] * 4
    assert lender.lent_count() == 4 and lender.free_count() == 0 and lender.made == 4  # three lent again
    del engine
    gc.collect()
    for thread in threads:
        thread.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    assert lender.lent_count() == 0 and lender.free_count() == lender.made == 4


def test_a_closed_engine_stays_usable_and_its_next_threads_take_streams_again(monkeypatch):
    from tests.fake_cuda import patch_cuda
    from tests.kernels.pools import make_device_pool, make_host_pool
    from tiered_kv import nsa_spec
    from tiered_kv.transfers.engine import TransferEngine

    patch_cuda(monkeypatch)
    lender, _ = _lender()
    spec = nsa_spec(num_layers=2, page_size=4)
    engine = TransferEngine(make_device_pool(spec, 8, "cpu").pool, make_host_pool(spec, 8, "page_first"))
    engine._streams = StreamLease(0, lender)
    engine._issue_threads(2)
    engine.close()
    assert engine._issuer is None and engine._issuer_stop is None and lender.lent_count() == 0
    again = engine._issue_threads(2)
    assert lender.lent_count() == 2 and lender.made == 2  # the same two streams, lent again
    engine.close()
    assert not any(t.is_alive() for t in again._threads)


def test_a_finished_job_does_not_keep_its_closure(monkeypatch):
    """A library thread forgets its last job once done: a job's closure holds the engine, whose
    collection gives its streams back."""
    import weakref

    from tests.fake_cuda import patch_cuda
    from tiered_kv.transfers.engine import _Issued, _IssueThreads

    patch_cuda(monkeypatch)
    threads = _IssueThreads(torch.device("cuda", 0), 1, 0, StreamLease(0, _lender()[0]))

    class Owner:
        pass

    owner = Owner()
    ran = threading.Event()
    issued = _Issued()
    threads.submit(0, lambda owner=owner: ran.set(), issued)
    issued.wait()
    assert ran.is_set()
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None
    threads.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_engines_streams_are_none_of_torchs_and_go_back_with_it():
    from tests.kernels.pools import make_device_pool, make_host_pool
    from tiered_kv import nsa_spec
    from tiered_kv.transfers.engine import TransferEngine

    lender = owned_streams.default_lender()
    assert lender is not None
    spec = nsa_spec(num_layers=4, page_size=64)
    device = make_device_pool(spec, 16, "cuda")
    host = make_host_pool(spec, 16, "page_first")
    engine = TransferEngine(device.pool, host)
    engine_handles = {int(getattr(engine, name).cuda_stream) for name in
                      ("load_stream", "load_copy_stream", "backup_stream", "backup_copy_stream", "load_uva_stream")}
    engine_handles |= {int(s.cuda_stream) for s in engine._head_streams}
    assert len(engine_handles) == 5 + 2
    torch_streams = {int(torch.cuda.Stream(priority=p).cuda_stream) for p in (0, -1, -100) for _ in range(70)}
    assert not engine_handles & torch_streams
    lent = lender.lent_count()
    assert lent >= len(engine_handles)
    del engine
    gc.collect()
    assert lender.lent_count() == lent - len(engine_handles)
    made = lender.made
    for _ in range(5):
        TransferEngine(device.pool, host)
        gc.collect()
    assert lender.made == made  # every later engine took the freed streams


def test_a_batch_on_the_legacy_default_stream_runs_on_the_kept_side_stream_in_order(monkeypatch):
    """The runtime refuses batches on the legacy default stream (handle 0): ``issue_batch`` runs
    them on the library's kept side stream, after the default stream's work and before its next."""
    from tiered_kv.kernels import batch_copy

    events: list = []

    class Recording:
        def __init__(self, handle: int) -> None:
            self.cuda_stream, self.device = handle, torch.device("cpu")

        def wait_stream(self, other) -> None:
            events.append(("wait", self.cuda_stream, other.cuda_stream))

    side = Recording(0x77)
    asked: list = []
    monkeypatch.setattr(batch_copy, "kept_stream", lambda device: asked.append(device) or side)
    batch_copy.issue_batch(Recording(0), lambda handle: events.append(("batch", handle)))
    assert events == [("wait", 0x77, 0), ("batch", 0x77), ("wait", 0, 0x77)] and len(asked) == 1
    events.clear()
    batch_copy.issue_batch(Recording(0x12), lambda handle: events.append(("batch", handle)))
    assert events == [("batch", 0x12)] and len(asked) == 1  # any other stream: the batch runs there
