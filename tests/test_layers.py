"""kbd's layers: which folder may import which, no import cycles, and the torch-free supervisor.

Imports are read with `ast` from every module, including those inside functions and under
`TYPE_CHECKING`: an import deferred for start-up time is still a dependency.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import ROOT

KBD = ROOT / "kbd"

# Lowest first. A module may import its own folder and the folders of lower layers; folders on
# one layer (the features) may not import each other. The top level (kbd/*.py) may import all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("shared",),  # the contract both sides of the process boundary agree on
    ("plan",),  # what to run: levels files, specs, descriptors, the finder, resources
    ("results",),  # records, benchmark statistics, the store
    ("bench",),  # fast_p, timing across processes, timing alone, the HTML report, compare
    ("caches",),  # content-addressed caches
    ("engine",),  # template, runner, scheduler, planning of jobs, what a run leaves behind
    ("views",),  # what a person sees: lines, summaries, JUnit, live progress
    ("tune",),  # tuning sessions, which run here, in the daemon and on a cluster
    ("levels", "cluster", "daemon"),  # the features
    ("commands",),  # one module per command
    ("",),  # kbd/*.py: the command line
)
# The worker side runs in the sandboxed worker: it may import only the contract and itself.
WORKER_MAY_IMPORT = {"shared", "worker"}
# Imported by nothing but the worker side (the supervisor is torch-free).
TORCH_SIDE = {"torch", "torch_mlir", "numpy"}


def _modules() -> dict[str, object]:
    """Dotted module name -> path, for every module of kbd."""
    found = {}
    for path in sorted(KBD.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(kbd modules, other top-level packages) that `module` imports anywhere in its body."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}".rstrip(".")
            # `from kbd.plan import spec` imports the module kbd.plan.spec
            names.update(
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            )
    ours, others = set(), set()
    for name in names:
        if name == "kbd" or name.startswith("kbd."):
            while name not in MODULES:
                name = name.rpartition(".")[0]
            if name != module:
                ours.add(name)
        else:
            others.add(name.partition(".")[0])
    return ours, others


GRAPH = {module: _imports(module)[0] for module in MODULES}


def _folder(module: str) -> str:
    """The layer folder of a module: kbd.plan.spec -> plan; kbd.cli -> ''."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (KBD / parts[1]).is_dir()):
        return parts[1]
    return ""


def _rank(folder: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if folder in layer)


def test_every_folder_of_kbd_is_in_a_layer():
    folders = {p.name for p in KBD.iterdir() if (p / "__init__.py").exists()}
    placed = {f for layer in LAYERS for f in layer} | {"worker"}
    assert folders - placed == set(), "a new folder needs a place in LAYERS"
    assert placed - folders - {""} == set(), "LAYERS names a folder that is gone"


def test_layers_import_only_downwards():
    wrong = []
    for module, imported in GRAPH.items():
        here = _folder(module)
        for other in sorted(imported):
            there = _folder(other)
            if other == "kbd" or there == here:
                continue  # the root package holds only the version
            if here == "worker" or there == "worker":
                # the supervisor starts workers by module name (kbd.worker.template), never
                # imports them
                allowed = here == "worker" and there in WORKER_MAY_IMPORT
            else:
                allowed = _rank(there) < _rank(here)
            if not allowed:
                wrong.append(f"{module} -> {other}")
    assert wrong == []


def test_no_import_cycles():
    """Tarjan's strongly connected components over the import graph: each is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in GRAPH[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert cycles == []


def test_few_modules_directly_in_kbd():
    """kbd/*.py is the command line only; everything else lives in a layer's folder."""
    assert len(list(KBD.glob("*.py"))) <= 12


def test_the_supervisor_never_imports_the_torch_side():
    wrong = [
        f"{module} imports {name}"
        for module in MODULES
        if _folder(module) != "worker"
        for name in sorted(_imports(module)[1] & TORCH_SIDE)
    ]
    assert wrong == []


def test_importing_every_supervisor_module_loads_no_torch_and_no_ray():
    """At run time too (what a module imports may import torch): only the cluster's head and
    agent load Ray, and the cluster's tuning, which runs on the head."""
    supervisor = [m for m in MODULES if _folder(m) != "worker" and m != "kbd.__main__"]
    with_ray = {"kbd.cluster.head", "kbd.cluster.agent", "kbd.cluster.tuning"}
    code = (
        "import importlib, sys\n"
        f"for name in {sorted(set(supervisor) - with_ray)!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = [m for m in ('torch', 'torch_mlir', 'numpy', 'ray') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_readme_layout_names_every_module():
    """The README's Layout section is the map: every module under its folder, none that is
    gone. A folder is a line starting `kbd/FOLDER/`; its modules are the `NAME.py` words on it
    and on the indented lines below it."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    named: set[str] = set()
    folder = None
    for line in block.splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if first.startswith("kbd/"):
            folder = first
        elif not line.startswith(" "):
            folder = None  # a line about the rest of the repository
        if folder is None:
            continue
        for word in line.replace(",", " ").split():
            if word.endswith(".py") and "/" not in word:
                named.add(folder + word)
    actual = {
        str(path.relative_to(ROOT)) for path in KBD.rglob("*.py") if path.name != "__init__.py"
    }
    assert sorted(actual - named) == [], "modules the Layout section does not name"
    assert sorted(named - actual) == [], "names in the Layout section that are no module"
