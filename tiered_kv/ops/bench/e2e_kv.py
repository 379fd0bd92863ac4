"""One request's KV as its model sees it: L1 pages in prompt order, and a wait per layer on the load.

``RequestKV`` is built by the end-to-end loop (``tiered_kv.ops.bench.e2e``) from the ``Prefill`` that
``L1PrefixCache.run`` hands over: the pages of the prompt's full pages (held on L1, being loaded
from L2, or to be computed), plus a scratch page for the partial tail page, which is never stored.
The model computes the tokens from ``compute_from`` on, in chunks (``chunks``), and per layer:

    kv.wait(layer)                      # the first time: the stream waits for that layer of the load
    k, v = kv.update(k_new, v_new, layer)   # MHA: write the chunk's k / v, get the whole prefix's
    kv.written(layer, end)              # other kinds: the chunk's pages of this layer are written

Full pages the model computed get ``PageOracle`` values once written (so a page's KV is a function
of its key); tokens of pages already on L1 or loaded are never written. ``wait`` records CUDA events
around each wait, so the loop can tell the time a layer waited for its load from the time it
computed. This is benchmark code: it must not be used on a serving path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ...model.device_pool import DeviceBuffer, DevicePool
from ...errors import PoolError
from ...model.spec import KVSpec
from .e2e_oracle import PageOracle, oracle_dtype


def mha_pool(spec: KVSpec, num_pages: int, device: torch.device | str, reserved: tuple[int, ...]) -> DevicePool:
    """An MHA L1 pool laid out as paged-attention engines keep it: per layer, k and v tensors of
    ``[pages, page_size, kv_heads, head_dim]`` (one row a page)."""
    dims = dict(spec.dims)
    heads, head_dim = int(dims["num_kv_heads"]), int(dims["head_dim"])
    dtype = oracle_dtype(spec)
    shape = (num_pages, spec.page_size, heads, head_dim)
    k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
    v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(spec.num_layers)]
    return DevicePool(spec, {"k": DeviceBuffer.page_indexed(k), "v": DeviceBuffer.page_indexed(v)}, reserved)


class RequestKV:
    """The prompt's pages on L1 for one forward (see the module docstring).

    Args:
        pool: the L1 device pool; oracle: the page oracle of its spec.
        keys, pages: the prompt's full pages (``Prefill.keys`` / ``Prefill.pages``).
        present_pages: leading pages already on L1 or loaded (never written).
        load: the load's handle (``wait_layer``), None when nothing is loaded.
        num_tokens: the prompt's length; tail_page: the scratch page of its partial last page.
        timing: record CUDA events around each wait.
    """

    def __init__(self, pool: DevicePool, oracle: PageOracle, keys: list[str], pages: list[int], *,
                 present_pages: int, load: Any, num_tokens: int, tail_page: int, timing: bool = False) -> None:
        spec = pool.spec
        size = spec.page_size
        self.pool = pool
        self.oracle = oracle
        self.page_size = size
        self.num_tokens = num_tokens
        self.full_pages = num_tokens // size
        if len(pages) != self.full_pages or len(keys) != self.full_pages:
            raise PoolError(f"a prompt of {num_tokens} tokens has {self.full_pages} full pages; L1 holds {len(pages)} "
                            "of them (L1 too small for this prompt)")
        self.pages = list(pages) + ([tail_page] if num_tokens % size else [])
        self.page_index = torch.tensor(self.pages, dtype=torch.int64).to(pool.device)
        self.present_pages = present_pages
        first = present_pages * size
        # Engines always compute the last token (its logits): a prompt held whole computes it again.
        self.compute_from = first if first < num_tokens else num_tokens - 1
        self.load = load
        self.timing = timing and pool.device.type == "cuda"
        computed_keys = keys[present_pages:]
        self._computed_bases = oracle.bases(computed_keys)
        self._computed_index = self.page_index[present_pages:self.full_pages]
        self._filled = [0] * spec.num_layers
        self._waited: set[int] = set()
        self.wait_events: list[tuple[int, Any, Any]] = []  # (layer, before the wait, after it)
        self._chunk = (self.compute_from, num_tokens)
        self._rows: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._mha: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    # --- the model's side --------------------------------------------------------------------
    def chunks(self, chunk_tokens: int | None) -> Iterator[tuple[int, int]]:
        """``[start, end)`` of each chunk of the tokens to compute, page-aligned after the first."""
        start, end = self.compute_from, self.num_tokens
        if not chunk_tokens:
            yield start, end
            return
        step = max(self.page_size, chunk_tokens // self.page_size * self.page_size)
        while start < end:
            stop = min(end, (start // self.page_size) * self.page_size + step)
            yield start, stop
            start = stop

    def begin_chunk(self, start: int, end: int) -> None:
        self._chunk = (start, end)
        self._rows = None
        self._mask = None

    def wait(self, layer: int) -> None:
        """Before the model reads ``layer``: the current stream waits for that layer of the load."""
        if layer in self._waited:
            return
        self._waited.add(layer)
        if self.load is None:
            return
        if self.timing:
            before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            before.record()
            self.load.wait_layer(layer)
            after.record()
            self.wait_events.append((layer, before, after))
        else:
            self.load.wait_layer(layer)

    def written(self, layer: int, upto: int) -> None:
        """Tokens up to ``upto`` of ``layer`` are written: computed full pages that end by then get
        the oracle's KV."""
        done = min(upto // self.page_size, self.full_pages) - self.present_pages
        have = self._filled[layer]
        if done > have:
            self.oracle.fill(self.pool, self._computed_bases[have:done], self._computed_index[have:done], layer)
            self._filled[layer] = done

    def attention_mask(self) -> torch.Tensor | None:
        """The chunk's causal mask against every key up to its end (bottom-right aligned); None
        where plain causal attention is the same (no earlier keys) or none is needed (one query)."""
        start, end = self._chunk
        if start == 0 or end - start == 1:
            return None
        if self._mask is None:
            device = self.pool.device
            queries = torch.arange(start, end, device=device)[:, None]
            self._mask = (torch.arange(end, device=device)[None, :] <= queries)[None, None]
        return self._mask

    # --- MHA: the transformers Cache interface ------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``[1, kv_heads, T, head_dim]`` k / v of the chunk in; the prefix's k / v up to the chunk's
        end out, read from the L1 pages (loaded ones after their layer landed)."""
        self.wait(layer_idx)
        k_cache, v_cache = self._mha_layer(layer_idx)
        start, end = self._chunk
        _, size, heads, head_dim = k_cache.shape
        first = max(start, self.present_pages * size)
        if end > first:
            rows = self._chunk_rows()[first - start:]
            k_cache.view(-1, heads, head_dim).index_copy_(0, rows, key_states[0, :, first - start:].transpose(0, 1))
            v_cache.view(-1, heads, head_dim).index_copy_(0, rows, value_states[0, :, first - start:].transpose(0, 1))
        self.written(layer_idx, end)
        pages = -(-end // size)
        index = self.page_index[:pages]
        k = k_cache.index_select(0, index).view(pages * size, heads, head_dim)[:end]
        v = v_cache.index_select(0, index).view(pages * size, heads, head_dim)[:end]
        return k.permute(1, 0, 2).unsqueeze(0), v.permute(1, 0, 2).unsqueeze(0)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._chunk[0]

    def _mha_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._mha is None:
            dims = dict(self.pool.spec.dims)
            shape = (-1, self.page_size, int(dims["num_kv_heads"]), int(dims["head_dim"]))
            dtype = oracle_dtype(self.pool.spec)
            self._mha = [tuple(self.pool.chunk_view(c, layer).view(dtype).view(shape) for c in (0, 1))
                         for layer in range(self.pool.spec.num_layers)]
        return self._mha[layer]

    def _chunk_rows(self) -> torch.Tensor:
        if self._rows is None:
            start, end = self._chunk
            positions = torch.arange(start, end, device=self.pool.device)
            self._rows = self.page_index[positions // self.page_size] * self.page_size + positions % self.page_size
        return self._rows

    # --- what the loop reads afterwards -------------------------------------------------------
    def wait_times_ms(self) -> list[tuple[int, float]]:
        """(layer, ms the stream stood waiting for that layer's load), after a synchronize."""
        return [(layer, before.elapsed_time(after)) for layer, before, after in self.wait_events]


__all__ = ["RequestKV", "mha_pool"]
