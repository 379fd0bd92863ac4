"""Kernel tests run Triton's interpreter on CPU tensors; GPU tests are marked and skipped without CUDA."""

import os

# The kernels pick the interpreter themselves for host-only copies; setting the variable too keeps
# Triton's own helpers in interpreter mode whatever imported triton first in this process.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
