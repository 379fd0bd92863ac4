"""CPU cost of planning a staged load's copy-engine copies: row copies against folded pitched ops.

A 61-layer DeepSeek-V3.2 load of 512 scattered ``layer_first`` slots (of 2048), in blocks of 8
layers, through the staging ring's planner (``StagedCopier._units``) and then either the 1-D row
copy list (``_copy_list``, one ``cudaMemcpyBatchAsync`` entry per row) or the folded pitched ops
(``fold_pitched`` + ``pack_2d_ops``, one ``cudaMemcpy3DBatchAsync`` op per slot, component and
unit). Runs anywhere: the host views are address-only stand-ins, nothing is copied. Prints the
number of copies and the planning ms per load (median of ``--reps``).

    python3 benchmarks/staged_planning_cpu.py [--reps 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from tiered_kv import nsa_spec
from tiered_kv.kernels import cudart
from tiered_kv.kernels.staged_copy import StagedCopier, fold_pitched

SLOTS, PAGES, BLOCK = 2048, 512, 8


class AddressView:
    """What the planner reads of a host chunk view: address, row pitch (default: dense rows,
    ``layer_first``), shape."""

    def __init__(self, address: int, width: int, pitch: int | None = None, slots: int = SLOTS) -> None:
        self.address, self.shape, self.pitch = address, (slots, width), pitch or width

    def data_ptr(self) -> int:
        return self.address

    def stride(self, dim: int) -> int:
        return self.pitch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = nsa_spec(61, 64)
    widths = [c.bytes_per_layer for c in spec.components]
    bases, address = [], 1 << 40
    for width in widths:  # layer_first: per component [layers, slots, bytes]
        bases.append(address)
        address += spec.num_layers * SLOTS * width

    def views(layers):
        return [AddressView(bases[c] + layer * SLOTS * widths[c], widths[c]) for layer in layers for c in range(len(widths))]

    rng = np.random.default_rng(args.seed)

    def draw():  # fresh slots per load, as in serving (the fold's chain cache must not hit by reuse)
        host = np.sort(rng.permutation(SLOTS)[:PAGES]).astype(np.int64)
        breaks = np.flatnonzero(np.diff(host) != 1) + 1
        return host, np.concatenate(([0], breaks)), np.concatenate((breaks, [host.size]))

    host, starts, ends = draw()
    blocks = [list(range(i, min(spec.num_layers, i + BLOCK))) for i in range(0, spec.num_layers, BLOCK)]
    copier = StagedCopier("cpu", buffer_bytes=32 << 20, num_buffers=2)
    print(f"{platform.processor() or platform.machine()}, python {platform.python_version()}, "
          f"{PAGES} of {SLOTS} slots scattered ({starts.size} runs), blocks of {BLOCK} layers")
    for pitched in (False, True):
        times, copies = [], 0
        for _ in range(args.reps):
            host, starts, ends = draw()
            t0, copies = time.perf_counter(), 0
            for block in blocks:
                for unit in copier._units(views(block), host, starts, ends, None, pitched):
                    if pitched:
                        f = fold_pitched(unit.host_copies, unit.bases)
                        cudart.pack_2d_ops(f[:, 2], f[:, 3], f[:, 0], f[:, 1], f[:, 4], f[:, 5])
                        copies += len(f)
                    else:
                        copies += len(copier._copy_list(unit.host_copies, 0, True))
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"{'pitched ops' if pitched else 'row copies':12s} {copies:7d} copies  "
              f"{statistics.median(times):6.2f} ms per load (median of {args.reps})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
