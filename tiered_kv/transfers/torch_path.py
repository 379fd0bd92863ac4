"""Checking and describing L1 <-> L2 page copies, and the pure torch path that performs them.

Validation runs on CPU copies of the indices, so no call forces a device sync, and it happens
before anything is written: out-of-range ids, duplicate destinations, reserved device pages,
mismatched lengths or pools of different specs raise ``IndexValidationError`` / ``SpecMismatchError``
naming the offending index.

``backup_pairs`` / ``load_pairs`` turn pools into the ``(src_view, dst_view)`` chunk pairs that every
copy path (``kernels.copy_pages_reference``, the Triton kernels, the copy-engine path) consumes.
``torch_backup`` / ``torch_load_layer`` are the reference path used on machines without CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from ..model.device_pool import DevicePool
from ..errors import IndexValidationError, PoolError, SpecMismatchError
from ..model.host_pool import HostPool
from ..model.integers import as_int
from ..kernels import copy_pages_reference

IdsLike = Sequence[int] | torch.Tensor | np.ndarray


_INT64 = (-(2**63), 2**63 - 1)


def _as_cpu_ids(ids: IdsLike, what: str) -> torch.Tensor:
    """``ids`` as a CPU int64 tensor: a 1-D integer tensor or numpy array, or a sequence of Python /
    numpy integers (0-d integer tensors too). Bools (``True`` is not page 1) and floats (``1.5`` is
    not page 1) are refused, naming the index."""
    if isinstance(ids, np.ndarray):
        if ids.ndim == 1 and ids.dtype.kind in "iu":
            if ids.dtype.kind == "u" and ids.size and ids.max() > _INT64[1]:  # would wrap to negative ids
                i = int(np.argmax(ids > _INT64[1]))
                raise IndexValidationError(f"{what}: index {i} is {int(ids[i])}, outside int64")
            return torch.from_numpy(ids.astype(np.int64, copy=True))
        if ids.ndim != 1:
            raise IndexValidationError(f"{what}: expected a 1-D index array, got shape {ids.shape}")
        raise IndexValidationError(f"{what}: expected integer indices, got {ids.dtype}")
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1:
            raise IndexValidationError(f"{what}: expected a 1-D index tensor, got shape {tuple(ids.shape)}")
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dtype.is_complex:
            raise IndexValidationError(f"{what}: expected integer indices, got {ids.dtype}")
        # One copy to the CPU; callers pass CPU tensors to avoid even that.
        return ids.to("cpu", torch.int64)
    if isinstance(ids, (str, bytes, bytearray)):
        raise IndexValidationError(f"{what}: expected a sequence of ints, got {type(ids).__name__}")
    try:
        items = list(ids)
    except TypeError:
        raise IndexValidationError(f"{what}: expected a sequence of ints, got {type(ids).__name__}") from None
    values = []
    for i, v in enumerate(items):
        if isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim == 0:
            v = v.item()  # a 0-d tensor of a bool or float item is refused below
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise IndexValidationError(f"{what}: index {i} is {repr(v)[:40]}, not an int ({type(v).__name__})")
        if not _INT64[0] <= v <= _INT64[1]:
            raise IndexValidationError(f"{what}: index {i} is {v}, outside int64")
        values.append(int(v))
    return torch.tensor(values, dtype=torch.int64)


def _check_layer(layer: object, num_layers: int) -> int:
    if isinstance(layer, (bool, np.bool_)) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < num_layers:
        raise IndexValidationError(f"layer {layer!r} is not a layer index in 0..{num_layers - 1}")
    return int(layer)


def pages_from_token_indices(token_indices: IdsLike, page_size: int) -> torch.Tensor:
    """Page ids from engine token indices (page-aligned, whole pages, contiguous within a page).

    Raises IndexValidationError naming the first index that breaks a rule.
    """
    size = as_int(page_size)
    if size is None or size < 1:
        raise IndexValidationError(f"token indices: the page size must be an int >= 1, got {page_size!r}")
    page_size = size
    tokens = _as_cpu_ids(token_indices, "token indices")
    negative = torch.nonzero(tokens < 0).flatten()
    if negative.numel():
        i = int(negative[0])
        raise IndexValidationError(f"token indices: index {i} (value {int(tokens[i])}) is negative")
    if tokens.numel() % page_size:
        raise IndexValidationError(f"token indices: {tokens.numel()} indices is not a whole number of pages of {page_size}")
    if tokens.numel() == 0:
        return tokens
    per_page = tokens.view(-1, page_size)
    firsts = per_page[:, 0]
    misaligned = torch.nonzero(firsts % page_size).flatten()
    if misaligned.numel():
        p = int(misaligned[0])
        raise IndexValidationError(
            f"token indices: index {p * page_size} (value {int(firsts[p])}) starts a page but is not a multiple "
            f"of the page size {page_size}"
        )
    expected = firsts.unsqueeze(1) + torch.arange(page_size)
    wrong = torch.nonzero((per_page != expected).flatten()).flatten()
    if wrong.numel():
        i = int(wrong[0])
        raise IndexValidationError(
            f"token indices: index {i} (value {int(tokens[i])}) should be {int(expected.flatten()[i])}: tokens of a page must be contiguous"
        )
    return firsts // page_size


def _ids_ok(ids: torch.Tensor, limit: int, *, unique: bool, reserved: frozenset[int]) -> bool:
    """Whether ``ids`` pass ``_check_ids`` (numpy, no message): a load's validation runs before
    its first copy, so on the model's critical path (about 10 us for 512 ids against 80 for the
    torch checks that name the offending index). It must agree with them id set by id set:
    ``tests/transfers/test_torch_path.py::test_fast_id_check_agrees_with_the_torch_check``."""
    values = ids.numpy()
    if values.min() < 0 or values.max() >= limit:
        return False
    if not (unique or reserved):
        return True
    if limit <= 64 * values.size:  # a bitmap of the id space costs less than a sort
        seen = np.zeros(limit, dtype=np.bool_)
        seen[values] = True
        if unique and np.count_nonzero(seen) != values.size:
            return False
        return not reserved or not seen[[p for p in reserved if 0 <= p < limit]].any()
    if unique:
        ordered = np.sort(values)
        if (ordered[1:] == ordered[:-1]).any():
            return False
    return not reserved or not np.isin(values, np.fromiter(reserved, dtype=np.int64)).any()


def _check_ids(ids: torch.Tensor, limit: int, what: str, *, unique: bool, reserved: frozenset[int] = frozenset()) -> None:
    if ids.numel() == 0 or _ids_ok(ids, limit, unique=unique, reserved=reserved):
        return
    out = torch.nonzero((ids < 0) | (ids >= limit)).flatten()
    if out.numel():
        i = int(out[0])
        raise IndexValidationError(f"{what}: index {i} is {int(ids[i])}, outside 0..{limit - 1}")
    if reserved:
        hit = torch.nonzero(torch.isin(ids, torch.tensor(sorted(reserved), dtype=torch.int64))).flatten()
        if hit.numel():
            i = int(hit[0])
            raise IndexValidationError(f"{what}: index {i} is page {int(ids[i])}, which the engine reserves")
    if unique:
        sorted_ids, order = torch.sort(ids, stable=True)
        dup = torch.nonzero(sorted_ids[1:] == sorted_ids[:-1]).flatten()
        if dup.numel():
            j = int(dup[0])
            raise IndexValidationError(
                f"{what}: index {int(order[j + 1])} repeats destination {int(sorted_ids[j])} (also at index {int(order[j])})"
            )


@dataclass(frozen=True)
class PageCopy:
    """A validated copy: CPU int64 ids of equal length, device pages and host slots."""

    device_pages: torch.Tensor
    host_slots: torch.Tensor

    def __len__(self) -> int:
        return self.device_pages.numel()

    @cached_property
    def scattered(self) -> bool:
        """Whether the host slots count as scattered (``transfer_policy.is_scattered``), computed
        once per copy: the path choice, the load split and a mixed backup all ask."""
        from .policy import is_scattered

        return is_scattered(self.host_slots)


def validate(device_pool: DevicePool, host_pool: HostPool, device_pages: IdsLike, host_slots: IdsLike,
             *, to_host: bool, token_indices: bool = False) -> PageCopy:
    """Check a copy between the pools before anything moves; returns its ids on the CPU.

    ``token_indices=True`` means ``device_pages`` holds engine token indices (see
    ``pages_from_token_indices``). Destinations must be unique; device pages must not be reserved.
    """
    # Checked by type first: pools passed in the wrong order (or not at all) would otherwise fail
    # deep inside with AttributeError, which must not leave the library.
    for name, pool, kind in (("device_pool", device_pool, DevicePool), ("host_pool", host_pool, HostPool)):
        if not isinstance(pool, kind):
            raise PoolError(f"{name} must be a {kind.__name__}, got {type(pool).__name__}"
                            + (" (device and host pools swapped?)" if isinstance(pool, (DevicePool, HostPool)) else ""))
    if device_pool.spec.fingerprint != host_pool.spec.fingerprint:
        raise SpecMismatchError(
            f"device pool spec ({device_pool.spec.describe()}) differs from host pool spec ({host_pool.spec.describe()})"
        )
    pages = (pages_from_token_indices(device_pages, device_pool.spec.page_size) if token_indices
             else _as_cpu_ids(device_pages, "device pages"))
    slots = _as_cpu_ids(host_slots, "host slots")
    if pages.numel() != slots.numel():
        raise IndexValidationError(f"{pages.numel()} device pages but {slots.numel()} host slots")
    _check_ids(pages, device_pool.num_pages, "device pages", unique=not to_host, reserved=device_pool.reserved_pages)
    _check_ids(slots, host_pool.num_slots, "host slots", unique=to_host)
    return PageCopy(pages, slots)


def backup_pairs(device_pool: DevicePool, host_pool: HostPool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Chunk pairs device -> host for every component and layer (layer-major, component-minor)."""
    spec = device_pool.spec
    return [(device_pool.chunk_view(ci, layer), host_pool.chunk_view(ci, layer))
            for layer in range(spec.num_layers) for ci in range(len(spec.components))]


def load_pairs(host_pool: HostPool, device_pool: DevicePool, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Chunk pairs host -> device for every component of one layer (latent *and* indexer)."""
    return [(host_pool.chunk_view(ci, layer), device_pool.chunk_view(ci, layer))
            for ci in range(len(device_pool.spec.components))]


def torch_backup(device_pool: DevicePool, host_pool: HostPool, device_pages: IdsLike, host_slots: IdsLike,
                 *, token_indices: bool = False) -> PageCopy:
    """Copy every component and layer of ``device_pages`` into ``host_slots`` (reference path)."""
    copy = validate(device_pool, host_pool, device_pages, host_slots, to_host=True, token_indices=token_indices)
    copy_pages_reference(backup_pairs(device_pool, host_pool), copy.device_pages, copy.host_slots)
    return copy


def torch_load_layer(host_pool: HostPool, device_pool: DevicePool, host_slots: IdsLike, device_pages: IdsLike,
                     layer: int, *, token_indices: bool = False) -> PageCopy:
    """Copy one layer (every component) of ``host_slots`` into ``device_pages`` (reference path)."""
    copy = validate(device_pool, host_pool, device_pages, host_slots, to_host=False, token_indices=token_indices)
    layer = _check_layer(layer, device_pool.spec.num_layers)
    copy_pages_reference(load_pairs(host_pool, device_pool, layer), copy.host_slots, copy.device_pages)
    return copy


def torch_load(host_pool: HostPool, device_pool: DevicePool, host_slots: IdsLike, device_pages: IdsLike,
               *, token_indices: bool = False) -> PageCopy:
    """Load every layer, one after another (reference path)."""
    copy = validate(device_pool, host_pool, device_pages, host_slots, to_host=False, token_indices=token_indices)
    for layer in range(device_pool.spec.num_layers):
        copy_pages_reference(load_pairs(host_pool, device_pool, layer), copy.host_slots, copy.device_pages)
    return copy
