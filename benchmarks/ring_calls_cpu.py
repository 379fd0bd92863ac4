"""How many copy-engine calls the staging ring makes for ``page_first`` loads from short runs.

A 61-layer DeepSeek-V3.2 load of 512 slots (of 2048) in runs of 4, 16 or 64, planned by the ring
(``StagedCopier._units``) for the two splits in question: ``auto``'s per-layer split with the
latent rows on the copy engines (slots in runs of 8 and more), and blocks of 8 layers with both
components (``auto``'s split for scattered slots). Prints the 2-D calls the ring makes when it
does not batch (one per copy) and the rows a memcpy batch would hold instead
(``staged_copy._batch_rows``). On the H200 a 2-D call cost about 21 us of issue and a batch row
about 1.3 us (docs/benchmarks.md, "Serving conditions, fourth round"). Runs anywhere: the views are
address-only stand-ins, nothing is copied.

    python3 benchmarks/ring_calls_cpu.py [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from staged_planning_cpu import PAGES, SLOTS, AddressView  # noqa: E402

from tiered_kv import nsa_spec  # noqa: E402
from tiered_kv.model.host_pool import HostPool  # noqa: E402
from tiered_kv.kernels.staged_copy import StagedCopier, _batch_rows  # noqa: E402

#: The modelled costs of the H200 run (us): one ``cudaMemcpy2DAsync``, one row of a memcpy batch.
US_PER_CALL, US_PER_ROW = 21.0, 1.3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = nsa_spec(61, 64)
    widths = [c.bytes_per_layer for c in spec.components]
    with HostPool(spec, 2, "page_first") as probe:  # the pool's own slot pitch (padded to 4 KiB)
        pitch = probe.chunk_view(0, 0).stride(0)
        offsets = [probe.chunk_view(c, layer).data_ptr() - probe.chunk_view(0, 0).data_ptr()
                   for c in range(len(widths)) for layer in range(spec.num_layers)]

    def view(layer: int, component: int) -> AddressView:
        return AddressView((1 << 40) + offsets[component * spec.num_layers + layer], widths[component], pitch)

    splits = {
        "per layer, latent rows (auto, runs >= 8)": [[view(layer, 0)] for layer in range(spec.num_layers)],
        "blocks of 8, both components": [[view(layer, c) for layer in range(b, min(spec.num_layers, b + 8)) for c in (0, 1)]
                                         for b in range(0, spec.num_layers, 8)],
    }
    rng = np.random.default_rng(args.seed)
    copier = StagedCopier("cpu")
    print(f"page_first slot pitch {pitch} B, {PAGES} of {SLOTS} slots")
    for run in (4, 16, 64):
        blocks = rng.permutation(SLOTS // run)[: -(-PAGES // run)]
        host = np.sort((blocks[:, None] * run + np.arange(run)).reshape(-1)[:PAGES]).astype(np.int64)
        breaks = np.flatnonzero(np.diff(host) != 1) + 1
        starts, ends = np.concatenate(([0], breaks)), np.concatenate((breaks, [host.size]))
        for name, groups in splits.items():
            units = [u for group in groups for u in copier._units(group, host, starts, ends)]
            calls = sum(len(u.host_copies) for u in units)
            rows = sum(_batch_rows(u.host_copies) for u in units)
            print(f"runs of {run:2d} ({starts.size:3d} runs)  {name:42s} 2-D calls {calls:5d} (~{calls * US_PER_CALL / 1e3:4.1f} ms)"
                  f"  batch rows {rows:6d} (~{rows * US_PER_ROW / 1e3:4.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
