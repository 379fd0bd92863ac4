"""Backups whose copy-engine rows library threads issue (``TransferOptions.backup_issue_threads``).

The split of a backup over threads (``byte_shares``), the options' checks, the handle's answers
while threads still issue, and the bytes: on CPU the shares run one after the other through the
same copy lists the GPU threads issue; on a GPU (marked) each share is its own memcpy batch on its
own thread and stream, joined into the handle's event.
"""

from __future__ import annotations

import os
import threading

import torch

if not torch.cuda.is_available():  # kernels through Triton's interpreter on CPU-only machines
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tiered_kv import ConfigError, nsa_spec  # noqa: E402
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs  # noqa: E402
from tiered_kv.transfers.engine import BackupHandle, TransferEngine, TransferOptions, _Issued, byte_shares  # noqa: E402
from tiered_kv.transfers.policy import BACKUP_ISSUE_THREADS_BY_PATH, MIXED_LOADS, MIXED_LOADS_BESIDE_BACKUP, MAX_ISSUE_THREADS, backup_issue_threads  # noqa: E402

from ..fake_cuda import FakeStream, patch_cuda  # noqa: E402
from ..kernels.pools import check_copy, make_device_pool, make_host_pool, random_ids  # noqa: E402

GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not GPU, reason="needs CUDA")


def _engine(layout: str, path: str, device: str = "cpu", pages: int = 24, slots: int = 20, **options):
    spec = nsa_spec(num_layers=5, page_size=4)
    device_pool = make_device_pool(spec, pages, device)
    host = make_host_pool(spec, slots, layout)
    return device_pool, host, TransferEngine(device_pool.pool, host, path=path, options=TransferOptions(**options))


@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7, 10, 11, 40])
def test_byte_shares_deal_every_pair_once_in_order_with_balanced_bytes(parts):
    device, host, _ = _engine("layer_first", "batch")
    pairs = backup_pairs(device.pool, host)  # 10 pairs: latent and indexer rows of 5 layers
    shares = byte_shares(pairs, parts)
    assert [p for share in shares for p in share] == pairs  # each once, in order (adjacent layers together)
    assert all(shares) and len(shares) == min(parts, len(pairs))
    widths = [[src.shape[1] for src, _ in share] for share in shares]
    loads = [sum(w) for w in widths]
    # No share is more than one (widest) pair away from an even split.
    assert max(loads) - min(loads) <= max(max(w) for w in widths)


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("path,extra", [("batch", {}), ("mixed", {"backup_ce_fraction": 0.5}),
                                        ("mixed", {"backup_ce_fraction": 1.0})])
@pytest.mark.parametrize("threads", [0, 1, 3])
def test_backups_through_threads_write_every_byte_and_only_those(layout, path, extra, threads):
    device, host, engine = _engine(layout, path, backup_issue_threads=threads, **extra)
    pages, slots = random_ids(9, 1, 24), torch.randperm(20)[:9]
    handles = []
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: handles.append(engine.backup(pages, slots)))
    assert handles[0].done() and handles[0].path == path and not handles[0].in_flight()
    engine.close()


@pytest.mark.parametrize("bad", [-1, MAX_ISSUE_THREADS + 1, True, 1.5, "2"])
def test_backup_issue_threads_must_be_an_int_in_range(bad):
    with pytest.raises(ConfigError, match="backup_issue_threads"):
        TransferOptions(backup_issue_threads=bad)


def test_backup_issue_threads_follow_the_table_unless_the_options_say():
    for path in ("batch", "mixed", "staged", "kernel", "direct", "torch"):
        assert backup_issue_threads(path, TransferOptions()) == BACKUP_ISSUE_THREADS_BY_PATH.get(path, 0)
        assert backup_issue_threads(path, TransferOptions(backup_issue_threads=3)) == 3
        assert backup_issue_threads(path, TransferOptions(backup_issue_threads=0)) == 0


class _Event:
    def __init__(self, done: bool) -> None:
        self.finished = done
        self.waited = 0

    def query(self) -> bool:
        return self.finished

    def synchronize(self) -> None:
        self.waited += 1


def test_a_handle_is_not_done_while_threads_issue_and_reraises_their_error():
    issued = _Issued()
    issued.add_jobs(2)
    event = _Event(done=True)
    handle = BackupHandle(event, None, "batch", issued)
    # Still issuing: not done, in flight, whatever the event says.
    assert not handle.done() and not handle.query() and handle.in_flight()
    issued.job_done()
    assert not handle.done() and handle.in_flight()
    # ``synchronize`` waits on the CPU for the last thread, then on the event.
    waiter = threading.Thread(target=handle.synchronize)
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive() and event.waited == 0
    issued.job_done()
    waiter.join(5)
    assert not waiter.is_alive() and event.waited == 1
    assert handle.done() and not handle.in_flight()
    event.finished = False  # issued, still copying
    assert not handle.done() and handle.in_flight()

    failed = _Issued()
    failed.add_jobs(1)
    broken = BackupHandle(_Event(done=False), None, "batch", failed)
    failed.job_done(RuntimeError("cudaMemcpyBatchAsync failed"))
    # The caller sees the thread's error; a path choice asking "in flight?" does not.
    with pytest.raises(RuntimeError, match="cudaMemcpyBatchAsync"):
        broken.done()
    with pytest.raises(RuntimeError, match="cudaMemcpyBatchAsync"):
        broken.synchronize()
    assert not broken.in_flight()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("path,extra", [("batch", {}), ("mixed", {"backup_ce_fraction": 0.3})])
@pytest.mark.parametrize("threads", [1, 4])
def test_gpu_backups_through_threads_write_every_byte(layout, path, extra, threads):
    spec = nsa_spec(num_layers=8, page_size=64)
    device = make_device_pool(spec, 1100, "cuda")
    host = make_host_pool(spec, 700, layout)
    engine = TransferEngine(device.pool, host, path=path,
                            options=TransferOptions(backup_issue_threads=threads, **extra))
    pages, slots = random_ids(512, 1, 1100), torch.randperm(700)[:512]  # scattered slots
    handles = []
    check_copy(backup_pairs(device.pool, host), pages, slots, [host.buffer],
               lambda: handles.append(engine.backup(pages, slots)) or handles[0].synchronize())
    assert handles[0].done() and not handles[0].in_flight()
    # Back into other pages through the engine: the bytes make the round trip.
    targets = random_ids(512, 1, 1100)
    pairs = [pair for layer in range(8) for pair in load_pairs(host, device.pool, layer)]
    check_copy(pairs, slots, targets, device.roots, lambda: engine.load(slots, targets).synchronize())
    engine.close()
    assert engine._backup_issuer is None and engine._issuer is None
    host.close()


@gpu
@pytest.mark.gpu
def test_gpu_a_load_beside_a_threaded_backup_sees_it_in_flight():
    spec = nsa_spec(num_layers=8, page_size=64)
    device = make_device_pool(spec, 1100, "cuda")
    host = make_host_pool(spec, 1100, "layer_first")
    engine = TransferEngine(device.pool, host, path="batch", options=TransferOptions(backup_issue_threads=4))
    torch.cuda._sleep(200_000_000)  # the backup waits behind this on the device
    backup = engine.backup(random_ids(512, 1, 550), torch.arange(0, 512))
    assert engine._last_backup is backup and backup.in_flight() and not backup.done()
    # The load's split is the one beside a backup while the threads issue or the copies run.
    assert engine._load_split(8) == MIXED_LOADS_BESIDE_BACKUP[True]
    backup.synchronize()
    assert backup.done() and not engine._last_backup.in_flight()
    assert engine._load_split(8) == MIXED_LOADS[(True, True)]
    engine.close()
    host.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_copy_rows_go_to_library_threads_and_join_into_the_event(monkeypatch, threads):
    """With ``backup_issue_threads=1`` the rows are issued from a library thread too (0 is the
    caller's thread); the last thread's stream waits on every share's join and on the path's own
    stream before it records the handle's event. Stand-in streams and events, no device."""
    import tiered_kv.kernels.batch_copy as batch_copy
    from tiered_kv.transfers.torch_path import validate
    from tiered_kv.transfers.engine import _Backup

    patch_cuda(monkeypatch)
    issued_from = []
    monkeypatch.setattr(batch_copy, "run_copy_list",
                        lambda copies, *, stream=None, on_gpu, flags=0: issued_from.append((threading.current_thread(), stream)))
    device, host, engine = _engine("layer_first", "batch", backup_issue_threads=threads)
    monkeypatch.setattr(engine, "on_gpu", True)
    copy = validate(device.pool, host, random_ids(6, 1, 24), torch.randperm(20)[:6], to_host=True)
    path_stream = FakeStream()
    job = _Backup(engine, copy, engine.options, done_on=path_stream, threads=threads)
    try:
        job.copy_rows(copy.device_pages, copy.host_slots, path_stream)
        assert job.issued is not None
        job.issued.wait()
    finally:
        engine.close()
    assert len(issued_from) == threads
    assert all(thread is not threading.current_thread() for thread, _ in issued_from)
    assert len(job.event.records) == 1
    last = job.event.records[0]
    joins = [event for event, _ in last.waited]
    assert all(count == 1 for _, count in last.waited) and len(joins) == threads + 2  # fork, joins, path's stream


def test_thread_counts_take_numpy_ints_and_keep_python_ints():
    import numpy as np

    options = TransferOptions(issue_threads=np.int64(2), backup_issue_threads=np.int32(3), caller_head_blocks=np.int64(1))
    assert (options.issue_threads, options.backup_issue_threads, options.caller_head_blocks) == (2, 3, 1)
    assert all(type(v) is int for v in (options.issue_threads, options.backup_issue_threads, options.caller_head_blocks))
    with pytest.raises(ConfigError, match="issue_threads"):
        TransferOptions(issue_threads=np.float64(2.0))
