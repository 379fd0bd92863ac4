"""One reader of an integer argument (a slot id, a layer index): what counts as an int here.

Python and numpy integers and 0-d integer numpy arrays / torch tensors are ints; bools (``True``
is not 1), floats (``1.5`` is not 1), complex numbers, text and anything else are not. Callers
raise their own error, naming what the value was for. Needs no torch: a tensor can only exist
once torch is imported.
"""

from __future__ import annotations

import sys

import numpy as np


def is_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def integer_dtype(array: object) -> bool:
    """True for integer numpy arrays and torch tensors (bool, float and complex are not ints)."""
    dtype = array.dtype  # type: ignore[attr-defined]
    if isinstance(array, np.ndarray):
        return dtype.kind in "iu"
    return not (dtype.is_floating_point or dtype.is_complex or dtype == sys.modules["torch"].bool)


def as_int(value: object) -> int | None:
    """``value`` as a Python int, or None where it is no integer (see the module docstring)."""
    if (is_tensor(value) or isinstance(value, np.ndarray)) and value.ndim == 0 and integer_dtype(value):  # type: ignore[attr-defined]
        value = value.item()  # type: ignore[attr-defined]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


__all__ = ["as_int", "integer_dtype", "is_tensor"]
