"""Repository hygiene that no linter checks by itself."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT, WHOLE_MODULES


def test_every_python_file_is_seen_by_ruff():
    """ruff skips files without a .py suffix: Python must live in .py files (scripts/ holds
    thin shell wrappers), so `ruff check kbd tests scripts` covers all of it."""
    files = subprocess.run(
        ["git", "ls-files", "kbd", "tests", "scripts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    hidden = []
    for name in files:
        path = ROOT / name
        if path.suffix == ".py" or not path.is_file():
            continue
        with open(path, "rb") as f:
            first = f.readline()
        if first.startswith(b"#!") and b"python" in first:
            hidden.append(name)
    assert hidden == []


def test_modules_with_a_module_scoped_fixture_run_whole_on_one_worker():
    """tests/conftest.py spreads the tests of other modules over the xdist workers one by one;
    a module-scoped fixture there would be set up again on every worker its tests reach."""
    with_module_fixture = {
        path.name
        for path in (ROOT / "tests").glob("test_*.py")
        if re.search(r"""scope=["']module["']""", path.read_text())
    }
    assert with_module_fixture == WHOLE_MODULES
