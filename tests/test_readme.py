"""The README and the docs it links, as a new user reads them: the commands hold together.

The ``$ tiered-kv`` lines run through the CLI (the python blocks run in
``tests/test_docs_code_blocks.py``). The two install-and-run commands are checked for what a fresh
Debian 12 needs (a virtual environment: Debian's pip refuses the system Python, PEP 668), and
``.ci/run`` for running exactly the README's test command. Running those two commands for real
needs a fresh machine (or a fresh clone under ``env -i``): see docs/install.md. Every relative
link points at a file, every doc is linked from the README, and the docs speak of the library, not
of the history of its work.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tiered_kv.ops import cli

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Words that would date a doc to the work that wrote it instead of describing the library: ordinal
# names of work periods and numbered passes (written as character classes, so that this line itself
# holds none of them).
HISTORY = re.compile(r"s[e]ssion|r[o]und [0-9]|tw[e]lfth|th[i]rt|tw[e]nt|el[e]venth|fi[f]teenth", re.I)


def user_docs() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def shell_commands() -> list[str]:
    """The README's indented one-line shell commands (the install-and-run ones)."""
    return [line.strip() for line in README.splitlines() if line.startswith("    ") and "apt-get" in line]


def test_readme_is_short():
    assert len(README.splitlines()) < 200


def test_links_in_the_docs_point_at_files():
    for doc in user_docs():
        for target in LINK.findall(doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(REPO)} links {target}, which is not there"


def test_every_doc_is_linked_from_the_readme():
    linked = {(REPO / t).resolve() for t in LINK.findall(README)}
    for doc in sorted(DOCS.glob("*.md")):
        assert doc.resolve() in linked, f"README.md does not link {doc.relative_to(REPO)}"


def test_the_transfer_results_section_code_points_to_exists():
    headings = re.findall(r"^#+ (.+)$", (DOCS / "benchmarks.md").read_text(), re.M)
    assert "Transfers on the H200" in headings


def test_the_docs_speak_of_the_library_not_of_its_history():
    for doc in user_docs():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            assert not HISTORY.search(line), f"{doc.relative_to(REPO)}:{number}: {line.strip()}"


def test_cli_examples_run(capsys):
    lines = [line[2:] for doc in user_docs() for line in doc.read_text().splitlines() if line.startswith("$ tiered-kv ")]
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
    that the command itself made before, with python3-venv from apt, and what runs afterwards is a venv's."""
    commands = shell_commands()
    assert len(commands) == 2, commands
    command = next(c for c in commands if ("pytest" in c) == (which == "tests"))
    steps = _steps(command)
    made = {m.group(1): i for i, s in enumerate(steps) if (m := re.fullmatch(r"python3 -m venv (\.venv[\w-]*)", s))}
    assert ".venv" in made
    apt = next(i for i, s in enumerate(steps) if s.startswith("apt-get install"))
    assert "python3-venv" in steps[apt].split() and apt < min(made.values())
    assert steps.index("apt-get update") < apt
    for i, step in enumerate(steps):
        if "pip" in step.split() or "-m pip" in step:
            m = re.match(r"(\.venv[\w-]*)/bin/python -m pip (install|uninstall) ", step)
            assert m and m.group(1) in made and made[m.group(1)] < i, step
    assert re.search(r"(^|\s)\.venv[\w-]*/bin/(tiered-kv|python -m pytest)(\s|$)", steps[-1]), steps[-1]
    # The version the suite and the H200 run (PyTorch's CPU build, from a local wheel folder where there is one).
    assert re.search(r"\.venv/bin/python -m pip install (--find-links \S+ )?torch==2\.13\.0 ", command), command


def test_ci_runs_exactly_the_readme_test_command():
    test_command = next(c for c in shell_commands() if "pytest" in c)
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    run = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert run == [test_command]


def test_venv_is_ignored():
    patterns = {line.strip() for line in (REPO / ".gitignore").read_text().splitlines()}
    assert patterns & {".venv", ".venv/", "/.venv", "/.venv/"}
