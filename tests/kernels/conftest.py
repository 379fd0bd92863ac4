"""Kernel tests run Triton's interpreter on CPU tensors; GPU tests are marked and skipped without CUDA."""

import os

import torch

# Without CUDA, every Triton kernel runs in the interpreter (the kernels also pick it themselves for
# host-only copies). With CUDA the GPU tests must compile for real, so the variable stays unset.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
