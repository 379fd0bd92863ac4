"""The README as a new user reads it: its python examples run as written, its commands hold together.

Every ```python block runs, in order, in one namespace (each example continues the one before),
on CPU; a block whose first line is ``# requires: cuda`` is skipped without CUDA. The ``$ tiered-kv``
lines run through the CLI. The two install-and-run commands are checked for what a fresh Debian 12
needs (a virtual environment: Debian's pip refuses the system Python, PEP 668), and ``.ci/run`` for
running exactly the README's test command. Running those two commands for real needs a fresh
machine (or a fresh clone under ``env -i``): see the README.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from tiered_kv import cli
from tiered_kv.host_pool import HostPool

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
GPU_MARKER = "# requires: cuda"


def python_blocks() -> list[tuple[int, str]]:
    """(first line number in README.md, code) of each ```python block."""
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", README, re.M | re.S):
        blocks.append((README.count("\n", 0, match.start(1)) + 1, match.group(1)))
    return blocks


def shell_commands() -> list[str]:
    """The README's indented one-line shell commands (the install-and-run ones)."""
    return [line.strip() for line in README.splitlines() if line.startswith("    ") and "apt-get" in line]


def test_python_examples_run_as_written(capsys):
    blocks = python_blocks()
    code = "".join(c for _, c in blocks)
    # What the examples must show a new user: the helpers exist and are used.
    for needed in ("allocate_engine_like(", "page_keys(", "Namespace", "DevicePool(", "TransferEngine(", "open_backend("):
        assert needed in code, f"no README example uses {needed}"
    namespace: dict = {"__name__": "readme_examples"}
    try:
        for line, block in blocks:
            if block.startswith(GPU_MARKER) and not torch.cuda.is_available():
                continue
            # Padded so that a traceback points at the README's own line numbers.
            exec(compile("\n" * (line - 1) + block, str(REPO / "README.md"), "exec"), namespace)
        pools = [v for v in namespace.values() if isinstance(v, HostPool)]
        assert pools, "the examples made no host pool"
        for pool in pools:
            pool.reap()
            assert pool.free_slots == pool.num_slots, "a README example leaves host slots allocated"
    finally:
        for value in namespace.values():
            if isinstance(value, HostPool):
                value.close()
    out = capsys.readouterr().out
    assert "[True, True, True]" in out  # the L3 example read back every page it stored


@pytest.mark.parametrize("write", ["write_through", "write_back"])
def test_the_engine_example_runs_under_each_write_policy(write, capsys):
    """The SGLang-style example as written, and with ``write_back``, whose ``on_l1_inserted``
    answers None (the pages are stored when the engine evicts them): both run, hit the same
    pages and leave every host slot free."""
    policy = 'write="write_through"'
    blocks = python_blocks()
    assert sum(policy in code for _, code in blocks) == 1, "the engine example names its write policy once"
    namespace: dict = {"__name__": "readme_examples"}
    try:
        for line, block in blocks:
            if block.startswith(GPU_MARKER) and not torch.cuda.is_available():
                continue
            block = block.replace(policy, f'write="{write}"')
            exec(compile("\n" * (line - 1) + block, str(REPO / "README.md"), "exec"), namespace)
        for pool in (v for v in namespace.values() if isinstance(v, HostPool)):
            pool.reap()
            assert pool.free_slots == pool.num_slots, "a README example leaves host slots allocated"
    finally:
        for value in namespace.values():
            if isinstance(value, HostPool):
                value.close()
    assert "hit 384 of 394 tokens" in capsys.readouterr().out


def test_keys_in_the_examples_are_str():
    namespace: dict = {}
    blocks = python_blocks()
    exec(compile("".join(c for _, c in blocks[:1]), "README.md", "exec"), namespace)  # spec and pools only
    try:
        from tiered_kv.keys import Namespace, page_keys

        keys = page_keys(Namespace.for_spec(namespace["spec"], model="m"), list(range(200)))
        assert len(keys) == 200 // namespace["spec"].page_size and all(isinstance(k, str) for k in keys)
    finally:
        namespace["host_pool"].close()


def test_cli_examples_run(capsys):
    lines = [line[2:] for line in README.splitlines() if line.startswith("$ tiered-kv ")]
    assert lines
    for line in lines:
        argv = shlex.split(line)[1:]
        assert cli.main(argv) == 0, line
        assert capsys.readouterr().out


def _steps(command: str) -> list[str]:
    return [step.strip() for step in command.split("&&")]


@pytest.mark.parametrize("which", ["main", "tests"])
def test_commands_work_with_debian_python(which):
    """Debian 12's python3 refuses ``pip install`` (externally managed): every pip runs in a venv
    that the command itself makes, with python3-venv from apt, and what runs afterwards is the venv's."""
    commands = shell_commands()
    assert len(commands) == 2, commands
    command = next(c for c in commands if ("pytest" in c) == (which == "tests"))
    steps = _steps(command)
    venv = steps.index("python3 -m venv .venv")
    apt = next(i for i, s in enumerate(steps) if s.startswith("apt-get install"))
    assert "python3-venv" in steps[apt].split() and apt < venv
    assert steps.index("apt-get update") < apt
    for i, step in enumerate(steps):
        if "pip" in step.split() or "-m pip" in step:
            assert step.startswith(".venv/bin/python -m pip install "), step
            assert i > venv
    assert re.search(r"(^|\s)\.venv/bin/(tiered-kv|python -m pytest)(\s|$)", steps[-1]), steps[-1]
    assert "pip install torch==2.13.0" in command  # the version the suite and the H200 run


def test_ci_runs_exactly_the_readme_test_command():
    test_command = next(c for c in shell_commands() if "pytest" in c)
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    run = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert run == [test_command]


def test_venv_is_ignored():
    patterns = {line.strip() for line in (REPO / ".gitignore").read_text().splitlines()}
    assert patterns & {".venv", ".venv/", "/.venv", "/.venv/"}
