"""Every ```python block of the user docs runs as written, each in a fresh interpreter.

A block is one complete program: it imports what it uses, from public places only
(``tiered_kv``, ``tiered_kv.hierarchy``, ``tiered_kv.backends``, ``tiered_kv.config``), and leaves
no host slot allocated (the blocks assert it themselves). Blocks that are not meant to run are
fenced as ```text or ```console; a block whose first line is ``# requires: cuda`` is skipped on a
machine without CUDA.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/integration.md"]
PUBLIC = {"tiered_kv", "tiered_kv.hierarchy", "tiered_kv.backends", "tiered_kv.config"}
GPU_MARKER = "# requires: cuda"
FENCE = re.compile(r"^```([A-Za-z0-9_-]*)\n(.*?)^```$", re.M | re.S)


def fenced_blocks(doc: str) -> list[tuple[str, int, str]]:
    """(language, first line number, code) of each fenced block of ``doc``."""
    text = (REPO / doc).read_text()
    return [(m.group(1), text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)]


def python_blocks() -> list[tuple[str, int, str]]:
    return [(doc, line, code) for doc in DOCS for lang, line, code in fenced_blocks(doc) if lang == "python"]


def block_id(block: tuple[str, int, str]) -> str:
    return f"{block[0]}:{block[1]}"


def test_every_fence_names_its_kind():
    """A bare ``` fence says nothing about whether it runs: each says python, text or console."""
    for doc in DOCS:
        for lang, line, _ in fenced_blocks(doc):
            assert lang in {"python", "text", "console"}, f"{doc}:{line}: fence ```{lang}"


def test_the_docs_have_examples():
    blocks = python_blocks()
    assert {doc for doc, _, _ in blocks} == set(DOCS)
    code = "".join(c for _, _, c in blocks)
    for needed in ("DevicePool(", "allocate_engine_like(", "page_keys(", "Namespace", "CacheManager(",
                   "TransferHalf(", "L3Controller(", "open_backend(", "L1PrefixCache(", "AsyncCacheManager("):
        assert needed in code, f"no example uses {needed}"


@pytest.mark.parametrize("block", python_blocks(), ids=block_id)
def test_imports_only_public_modules(block):
    doc, line, code = block
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tiered_kv":
            assert node.module in PUBLIC, f"{doc}:{line + node.lineno - 1}: from {node.module} import ..."
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tiered_kv":
                    assert alias.name in PUBLIC, f"{doc}:{line + node.lineno - 1}: import {alias.name}"


@pytest.mark.parametrize("block", python_blocks(), ids=block_id)
def test_block_runs_as_written(block, tmp_path):
    doc, line, code = block
    if code.startswith(GPU_MARKER) and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    # Padded so that a traceback names the doc's own line numbers.
    script = tmp_path / "block.py"
    script.write_text("\n" * (line - 1) + code)
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=100)
    assert result.returncode == 0, f"{doc}:{line} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    # A print's trailing comment starts with what it prints (up to ": " and an explanation).
    shown = [c.split("#", 1)[1].split(": ")[0].strip() for c in code.splitlines()
             if c.lstrip().startswith("print(") and "#" in c]
    printed = result.stdout.splitlines()
    assert len(printed) == len(shown), f"{doc}:{line}: printed {printed}, the comments say {shown}"
    for out, says in zip(printed, shown):
        assert says in out, f"{doc}:{line}: printed {out!r}, the comment says {says!r}"


@pytest.mark.parametrize("write", ["write_through", "write_through_selective", "write_back"])
def test_the_readme_example_runs_under_each_write_policy(write, tmp_path):
    """The README's engine example with each write policy: the L1 events that answer None under
    it (``on_l1_inserted`` under write_back) are handled, the prompt is hit and no slot leaks."""
    [(_, line, code)] = [b for b in python_blocks() if b[0] == "README.md"]
    policy = 'write="write_through"'
    assert code.count(policy) == 1, "the README example names its write policy once"
    code = code.replace(policy, f'write="{write}"')
    if write == "write_through_selective":  # stores a page once it was hit: nothing is hit here
        code = code.replace('print(f"hit {len(load_plan)', 'print(f"hit* {len(load_plan)')
    script = tmp_path / "readme.py"
    script.write_text("\n" * (line - 1) + code)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "error"}, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = "hit* 0 of 394 tokens" if write == "write_through_selective" else "hit 384 of 394 tokens"
    assert expected in result.stdout
