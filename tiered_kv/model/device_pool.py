"""L1: a view over the serving engine's own per-layer KV tensors. It allocates nothing.

Engines lay components out differently, so each component is described by a ``DeviceBuffer``:
the engine's per-layer tensors plus how many leading-dimension rows make one page. SGLang's NSA
latent is token-indexed ``[tokens, 1, 656]`` (64 rows a page), its indexer page-indexed
``[pages, 8448]`` (1 row a page); a vLLM k cache sliced out of ``[blocks, 2, ...]`` is page-indexed
with a row stride of twice its page. Everything downstream sees *chunk views*: ``uint8 [pages,
chunk_bytes]`` per (component, layer), with the engine's page stride.

Pages the engine reserves (SGLang's page 0 is a padding sink) are never read or written: transfers
reject them before launch. On a CPU machine the tensors are CPU tensors, which is how CI runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import IndexValidationError, SpecError
from .spec import KVSpec, check_spec


@dataclass(frozen=True)
class DeviceBuffer:
    """One component of the engine's pool: a tensor per layer, ``rows_per_page`` rows per page.

    Each row (``tensor[i]``) must be contiguous; consecutive rows of a page must be adjacent when
    ``rows_per_page > 1``. Row ``page * rows_per_page`` starts page ``page``.
    """

    layers: tuple[torch.Tensor, ...]
    rows_per_page: int = 1

    def __post_init__(self) -> None:
        # One tensor where a list of per-layer tensors belongs would be taken row by row as
        # "layers" (a [pages, bytes] tensor of 61 pages passes as 61 layers): refuse it here.
        if isinstance(self.layers, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in self.layers):
            got = type(self.layers).__name__ if isinstance(self.layers, torch.Tensor) else \
                [type(t).__name__ for t in self.layers][:4]
            raise SpecError(f"a DeviceBuffer takes a list of per-layer tensors, got {got}")
        if isinstance(self.rows_per_page, bool) or not isinstance(self.rows_per_page, int) or self.rows_per_page < 1:
            raise SpecError(f"rows per page (page_size of a token-indexed buffer) must be an int >= 1, got {self.rows_per_page!r}")

    @classmethod
    def token_indexed(cls, layers: Sequence[torch.Tensor], page_size: int) -> "DeviceBuffer":
        """Tensors ``[tokens, ...]``: ``page_size`` token rows make a page (SGLang's latent)."""
        return cls(_layer_tuple(layers), page_size)

    @classmethod
    def page_indexed(cls, layers: Sequence[torch.Tensor]) -> "DeviceBuffer":
        """Tensors ``[pages, ...]``: one row is a page (SGLang's indexer, vLLM blocks)."""
        return cls(_layer_tuple(layers), 1)


def _layer_tuple(layers: object) -> tuple:
    """The per-layer tensors as a tuple; a single tensor stays one (``__post_init__`` refuses it)."""
    if isinstance(layers, torch.Tensor):
        return layers  # type: ignore[return-value]
    try:
        return tuple(layers)  # type: ignore[call-overload]
    except TypeError:
        raise SpecError(f"a DeviceBuffer takes a list of per-layer tensors, got {type(layers).__name__}") from None


def _chunk_view(t: torch.Tensor, rows_per_page: int, what: str) -> torch.Tensor:
    """``uint8 [pages, chunk_bytes]`` over ``t`` with the engine's page stride; no copy."""
    if t.dim() < 1 or t.shape[0] < rows_per_page:
        raise SpecError(f"{what}: tensor of shape {tuple(t.shape)} holds less than one page ({rows_per_page} rows)")
    item = t.element_size()
    if not t[0].is_contiguous():
        raise SpecError(f"{what}: each row must be contiguous; shape {tuple(t.shape)} strides {t.stride()}")
    row_bytes = t[0].numel() * item
    row_stride = t.stride(0) * item
    if rows_per_page > 1 and row_stride != row_bytes:
        raise SpecError(f"{what}: token rows of a page must be adjacent (row stride {row_stride} B, row {row_bytes} B)")
    flat = t.view(torch.uint8) if t.dim() > 0 and t.stride(-1) == 1 else None
    if flat is None:
        raise SpecError(f"{what}: innermost dimension must be contiguous, strides {t.stride()}")
    num_pages = t.shape[0] // rows_per_page
    return torch.as_strided(
        flat,
        (num_pages, rows_per_page * row_bytes),
        (rows_per_page * row_stride, 1),
        t.storage_offset() * item,
    )


def _page_ids(pages: Iterable[int], what: str) -> list[int]:
    """Python ints from ints, numpy integers or an integer array / tensor; bools and floats (which
    ``int()`` would turn into page ids) are refused, naming the index."""
    if isinstance(pages, (torch.Tensor, np.ndarray)):
        pages = pages.reshape(-1).tolist() if _integer_array(pages) else [pages]
    elif isinstance(pages, (str, bytes)) or not isinstance(pages, Iterable):
        raise SpecError(f"{what}: expected a collection of int page ids, got {type(pages).__name__}")
    out = []
    for i, p in enumerate(pages):
        if isinstance(p, (torch.Tensor, np.ndarray)) and p.ndim == 0 and _integer_array(p):
            p = p.item()
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)):
            raise SpecError(f"{what}: index {i} is {repr(p)[:40]}, not an int page id ({type(p).__name__})")
        out.append(int(p))
    return out


def chunk_of(views: list[list[torch.Tensor]], component_index: int, layer: int) -> torch.Tensor:
    """``views[component_index][layer]``; IndexValidationError for a bool, a non-int or out of range
    (a list would take -1 and True silently)."""
    for value, what, limit in ((component_index, "component index", len(views)), (layer, "layer", len(views[0]))):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < limit:
            raise IndexValidationError(f"{what} {value!r} outside 0..{limit - 1}")
    return views[component_index][layer]


def _integer_array(array: torch.Tensor | np.ndarray) -> bool:
    if isinstance(array, np.ndarray):
        return array.dtype.kind in "iu"
    return not (array.dtype.is_floating_point or array.dtype.is_complex or array.dtype == torch.bool)


class DevicePool:
    """The engine's L1 pool seen as pages of ``spec``; wraps tensors, allocates nothing.

    Args:
        spec: what a page holds.
        buffers: one ``DeviceBuffer`` per spec component, by component name.
        reserved_pages: page ids no transfer may touch.
    """

    def __init__(self, spec: KVSpec, buffers: Mapping[str, DeviceBuffer], reserved_pages: Iterable[int] = ()) -> None:
        check_spec(spec)
        if not isinstance(buffers, Mapping) or not all(isinstance(b, DeviceBuffer) for b in buffers.values()):
            raise SpecError("device buffers must be a mapping of component name -> DeviceBuffer "
                            "(DeviceBuffer.token_indexed / page_indexed)")
        expected = [c.name for c in spec.components]
        if sorted(buffers) != sorted(expected):
            raise SpecError(f"device buffers {sorted(buffers)} do not match the spec's components {expected}")
        self.spec = spec
        self._views: list[list[torch.Tensor]] = []
        devices: set[torch.device] = set()
        for component in spec.components:
            buffer = buffers[component.name]
            if len(buffer.layers) != spec.num_layers:
                raise SpecError(f"component {component.name!r}: {len(buffer.layers)} layer tensors, spec has {spec.num_layers} layers")
            views = []
            for layer, tensor in enumerate(buffer.layers):
                what = f"component {component.name!r} layer {layer}"
                view = _chunk_view(tensor, buffer.rows_per_page, what)
                if view.shape[1] != component.bytes_per_layer:
                    raise SpecError(
                        f"{what}: a page of tensor shape {tuple(tensor.shape)} ({tensor.dtype}, {buffer.rows_per_page} rows) "
                        f"is {view.shape[1]} B, the spec says {component.bytes_per_layer} B"
                    )
                views.append(view)
                devices.add(tensor.device)
            self._views.append(views)
        if len(devices) != 1:
            raise SpecError(f"all device tensors must be on one device, got {sorted(map(str, devices))}")
        self.device: torch.device = devices.pop()
        # Components may have a different page count (SGLang's indexer has spare pages): the pool
        # exposes the pages every component has.
        self.num_pages = min(v.shape[0] for views in self._views for v in views)
        reserved = frozenset(_page_ids(reserved_pages, "reserved pages"))
        bad = [p for p in reserved if not 0 <= p < self.num_pages]
        if bad:
            raise SpecError(f"reserved pages {sorted(bad)} outside 0..{self.num_pages - 1}")
        self.reserved_pages = reserved

    def chunk_view(self, component_index: int, layer: int) -> torch.Tensor:
        """``uint8 [num_pages(component), bytes_per_layer]`` for one (component, local layer)."""
        return chunk_of(self._views, component_index, layer)

    def __repr__(self) -> str:
        return f"DevicePool({self.spec.kind}, pages={self.num_pages}, device={self.device}, reserved={sorted(self.reserved_pages)})"


def allocate_engine_like(spec: KVSpec, num_pages: int, device: str | torch.device = "cpu",
                         reserved_pages: Iterable[int] = (0,)) -> DevicePool:
    """Allocate tensors shaped the way an SGLang-style engine would and wrap them.

    For the embedded default (replay, benchmarks, tests): the first component is token-indexed
    ``[pages * page_size, bytes_per_token_row]`` and the others page-indexed ``[pages, bytes]``,
    all uint8, one tensor per layer.
    """
    check_spec(spec)
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
        raise SpecError(f"num_pages must be an int >= 1, got {num_pages!r}")
    try:
        device = torch.device(device)
        torch.empty(0, device=device)  # a device torch cannot reach fails here, as one line
    except (RuntimeError, TypeError, AssertionError) as exc:  # AssertionError: CUDA not compiled in
        raise SpecError(f"device {str(device)!r} cannot hold the pool: {' '.join(str(exc).split())}") from None
    buffers: dict[str, DeviceBuffer] = {}
    for i, c in enumerate(spec.components):
        if i == 0 and c.bytes_per_layer % spec.page_size == 0:
            row = c.bytes_per_layer // spec.page_size
            layers = [torch.empty(num_pages * spec.page_size, 1, row, dtype=torch.uint8, device=device) for _ in range(spec.num_layers)]
            buffers[c.name] = DeviceBuffer.token_indexed(layers, spec.page_size)
        else:
            layers = [torch.empty(num_pages, c.bytes_per_layer, dtype=torch.uint8, device=device) for _ in range(spec.num_layers)]
            buffers[c.name] = DeviceBuffer.page_indexed(layers)
    return DevicePool(spec, buffers, reserved_pages)
