"""What every benchmark probe's command line owes a user, checked the same way for each: bad
arguments are refused with one ``error:`` line and exit 2, before any pool or device work."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import pytest


def assert_refused(monkeypatch, capsys, main: Callable[[], int], script: str, argv: Sequence[str],
                   message: str = "error:") -> None:
    """``script argv`` exits 2 through ``main`` and says ``message`` on stderr."""
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
