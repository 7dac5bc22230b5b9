"""Repository hygiene that no linter checks by itself."""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator

from kbd.shared import protocol
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


# Calls that name a phase by their first argument: a heartbeat, a worker's step, the daemon's
# event.
_PHASE_CALLS = ("Phase", "KernelPhase", "announce", "step")


def _phase_literals(node: ast.AST) -> Iterator[str]:
    """String literals `node` uses as a phase name: announced, assigned or compared."""

    def named_phase(target: ast.AST) -> bool:
        name = getattr(target, "id", None) or getattr(target, "attr", "")
        return "phase" in name.lower()

    def strings(*values: ast.AST) -> Iterator[str]:
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.value

    if isinstance(node, ast.Call):
        callee = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
        if callee in _PHASE_CALLS:
            yield from strings(*node.args[:1])
        yield from strings(*(k.value for k in node.keywords if k.arg and "phase" in k.arg))
    elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = zip(target.elts, node.value.elts, strict=False)
                yield from strings(*(value for name, value in pairs if named_phase(name)))
            elif named_phase(target):
                yield from strings(node.value)
    elif isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(named_phase(o) or getattr(o, "attr", "") == "name" for o in operands):
            yield from strings(*operands)


def test_phase_names_the_other_side_acts_on_are_spelled_once_in_the_protocol():
    """A worker announces `bench`, `sandbox` and `pipeline:<stage>` and the supervisor tests
    for them (the supervisor and a cluster agent start kernels in `start`): outside
    kbd/shared/protocol.py these are never literals where a phase is announced, assigned or
    compared, so both sides cannot drift apart."""
    shared = {protocol.START_PHASE, protocol.SANDBOX_PHASE, protocol.BENCH_PHASE}
    prefix = protocol.pipeline_phase("")
    spelled = []
    for path in sorted((ROOT / "kbd").rglob("*.py")):
        if path == ROOT / "kbd" / "shared" / "protocol.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            literals = list(_phase_literals(node))
            if isinstance(node, ast.Constant) and str(node.value).startswith(prefix):
                literals.append(node.value)  # also the start of an f-string
            for literal in literals:
                if literal in shared or literal.startswith(prefix):
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}: {literal!r}")
    assert spelled == []
