"""The copy paths against the reference on a GPU at realistic sizes (run on the H200).

Device pools in GPU memory, pinned host pools in both layouts, DeepSeek-V3.2 NSA at full shape
plus MLA and MHA; random device pages and host slots in runs (what the allocator hands out) or
scattered. Byte-for-byte checks with poisoned destinations, as on CPU.
"""

from __future__ import annotations

import pytest
import torch

from tiered_kv import mha_spec, mla_spec, nsa_spec
from tiered_kv.kernels import StagedCopier, copy_pages_batch, copy_pages_direct, copy_pages_uva
from tiered_kv.transfers.torch_path import backup_pairs, load_pairs

from .pools import adjacent_ids, check_copy, make_device_pool, make_host_pool, random_ids

pytestmark = pytest.mark.gpu

SPECS = {
    "nsa": nsa_spec(61, 64),
    "mla": mla_spec(61, 64),
    "mha": mha_spec(32, 16, 8, 128),
}
PAGES, SLOTS, COUNT = 400, 330, 257


@pytest.fixture(scope="module")
def copiers():
    # ``small``: a ring of 2 MiB buffers, so a call is many units and every buffer is reused.
    return {"load": StagedCopier("cuda"), "backup": StagedCopier("cuda", buffer_bytes=8 << 20, num_buffers=3),
            "small": StagedCopier("cuda", buffer_bytes=2 << 20, num_buffers=2)}


def _run(path, pairs, src, dst, to_device, copiers):
    if path == "uva":
        copy_pages_uva(pairs, src, dst)
    elif path == "direct":
        copy_pages_direct(pairs, src, dst)
    elif path == "batch":
        copy_pages_batch(pairs, src, dst)
    else:
        copy_stream, kernel_stream = torch.cuda.Stream(), torch.cuda.Stream()
        copy_stream.wait_stream(torch.cuda.current_stream())
        kernel_stream.wait_stream(torch.cuda.current_stream())
        copier = copiers["small" if path == "staged_small" else "load" if to_device else "backup"]
        if to_device:
            copier.to_device(pairs, src, dst, copy_stream=copy_stream, kernel_stream=kernel_stream)
        else:
            copier.to_host(pairs, src, dst, copy_stream=copy_stream, kernel_stream=kernel_stream)
        # Completion is ordered on the kernel stream (loads) or the copy stream (backups).
        torch.cuda.current_stream().wait_stream(kernel_stream if to_device else copy_stream)


@pytest.mark.parametrize("slots_kind", ["runs", "scattered"])
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
@pytest.mark.parametrize("spec_name", sorted(SPECS))
@pytest.mark.parametrize("path", ["uva", "direct", "batch", "staged", "staged_small"])
def test_gpu_backup_and_load(path, spec_name, layout, slots_kind, copiers):
    spec = SPECS[spec_name]
    device = make_device_pool(spec, PAGES, "cuda")
    host = make_host_pool(spec, SLOTS, layout)
    with host:  # unpins at the end
        pages = random_ids(COUNT, 1, PAGES)
        slots = adjacent_ids(COUNT, 0, SLOTS) if slots_kind == "runs" else random_ids(COUNT, 0, SLOTS)
        pairs = backup_pairs(device.pool, host)
        check_copy(pairs, pages, slots, [host.buffer], lambda: _run(path, pairs, pages, slots, False, copiers))
        layer = int(torch.randint(0, spec.num_layers, ()).item())
        pairs = load_pairs(host, device.pool, layer)
        check_copy(pairs, slots, pages, device.roots, lambda: _run(path, pairs, slots, pages, True, copiers))


@pytest.mark.parametrize("num_ctas", [1, 4, 16, 132])
def test_gpu_uva_budgets_and_single_page(num_ctas):
    spec = SPECS["nsa"]
    device = make_device_pool(spec, PAGES, "cuda")
    with make_host_pool(spec, SLOTS, "page_first") as host:
        for count in (0, 1, COUNT):
            pages, slots = random_ids(count, 1, PAGES), random_ids(count, 0, SLOTS)
            pairs = backup_pairs(device.pool, host)
            check_copy(pairs, pages, slots, [host.buffer], lambda: copy_pages_uva(pairs, pages, slots, num_ctas=num_ctas))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_gpu_kept_tables_serve_later_calls_of_any_size_on_other_streams(layout):
    """The ring keeps each list's unit tables on the device after the first call: later backups
    and loads of the same views, of other sizes and slots, issued on other streams (which must
    wait for the tables' upload), still copy every byte."""
    spec = SPECS["nsa"]
    device, host = make_device_pool(spec, PAGES, "cuda"), make_host_pool(spec, SLOTS, layout)
    with host:
        copiers = {"backup": StagedCopier("cuda", buffer_bytes=8 << 20, num_buffers=3), "load": StagedCopier("cuda")}
        backup, load = backup_pairs(device.pool, host), [load_pairs(host, device.pool, layer) for layer in (0, 30)]
        for call, count in enumerate((COUNT, 64, COUNT, 1, 200)):
            copy_stream, kernel_stream = torch.cuda.Stream(), torch.cuda.Stream()  # new streams each call
            for stream in (copy_stream, kernel_stream):
                stream.wait_stream(torch.cuda.current_stream())
            pages = random_ids(count, 1, PAGES)
            slots = adjacent_ids(count, 0, SLOTS) if call % 2 else random_ids(count, 0, SLOTS)
            streams = {"copy_stream": copy_stream, "kernel_stream": kernel_stream}

            def run_backup():
                copiers["backup"].to_host(backup, pages, slots, **streams)
                torch.cuda.current_stream().wait_stream(copy_stream)

            def run_load():
                copiers["load"].to_device_groups(load, slots, pages, **streams)
                torch.cuda.current_stream().wait_stream(kernel_stream)
            check_copy(backup, pages, slots, [host.buffer], run_backup)
            check_copy([pair for group in load for pair in group], slots, pages, device.roots, run_load)
        kept = [len(geometry.tables) for geometry in copiers["backup"]._geometries.values()]
        assert kept and all(count >= 1 for count in kept)
