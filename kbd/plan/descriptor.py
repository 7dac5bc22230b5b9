"""Pipeline descriptors: YAML files that list MLIR passes, transform scripts and includes.

A descriptor is a mapping with one key, `Pipeline`, holding a list of single-key entries:

- `pass: name` or `pass: name{k=v flag}`: an MLIR pass; a bare `flag` means `flag=true`.
- `transform: script.mlir` or `transform: script.mlir {var=value ...}`: a transform-dialect
  script, run by the transform interpreter; every `$var` in the script's text is replaced by
  `value`, so tile sizes and vector widths can be set from the descriptor that uses it.
- `include: other.yaml` or `include: other.yaml {var=value ...}`: inline another descriptor;
  every `$var` in the included file's entries is replaced by `value` (whole names only, so
  `$tile` never touches `$tile_size`). Variables are not inherited: re-export them explicitly.

Two optional top-level keys make a descriptor tunable (kbd.plan.space reads the second):
- `Vars: {name: value, ...}`: defaults of the `$name`s in its own entries; an include's
  `{var=value}` or a command line's `file.yaml{var=value}` overrides them (a name the file does
  not declare is an error, so a typo never goes unnoticed);
- `Tune: {space: {name: domain, ...}, constraints: [expression, ...]}`: which of its Vars
  `kbd tune` searches, and which combinations are valid.

Include and transform paths are looked up next to the including file, then in the schedules
directory. Pure Python: the supervisor expands pipelines without importing torch or MLIR.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from kbd.plan import target
from kbd.shared.errors import InputError
from kbd.shared.protocol import Stage

DEFAULT_PIPELINE = "scalar-lowering.yaml"

_PASS_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_OPTION_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_VARIABLE_NAME = re.compile(r"\w+")
_VARIABLE = re.compile(r"\$(\w+)")
_OPEN, _CLOSE = "{[(", "}])"
_BOOLEANS = ("true", "false")
_TOP_LEVEL = ("Pipeline", "Vars", "Tune")


def resolve_pipeline(specs: list[str], *, schedules_dir: Path, cwd: Path) -> list[Stage]:
    """Expand pipeline specs (as given to --pipeline, repeatable, applied in order) into flat
    stages. A spec is a .yaml or .mlir file (CWD-relative or absolute, else under schedules_dir),
    a descriptor name under schedules_dir (`scalar-lowering`), else a pass `name{opts}`."""
    stages: list[Stage] = []
    for spec in specs:
        stages += _resolve_spec(spec, schedules_dir, cwd)
    return stages


def find_pipeline(
    name: str, dtype: str, *, schedules_dir: Path, arch: str, features: Sequence[str]
) -> Path | None:
    """The finder: schedules/<arch>/<feature>/<name>/<dtype>.yaml (features in given order),
    else schedules/<arch>/<name>/<dtype>.yaml, else None."""
    if not name or not arch:
        return None
    base = schedules_dir / arch
    for directory in [*(base / feature for feature in features if feature), base]:
        candidate = directory / name / f"{dtype}.yaml"
        if candidate.is_file():
            return candidate
    return None


def host_target() -> tuple[str, list[str]]:
    """This machine's architecture and CPU feature flags (from /proc/cpuinfo)."""
    machine = target.this_machine()
    return machine.arch, machine.flags


# --- command-line specs ---------------------------------------------------------------------


def _resolve_spec(spec: str, schedules_dir: Path, cwd: Path) -> list[Stage]:
    """Stages for one --pipeline value: a descriptor, a transform script or a pass."""
    text = spec.strip()
    where = f"--pipeline {spec}"
    if _is_python(text):
        raise InputError(
            f"{where}: Python schedule generators are not supported; use a .mlir transform script"
        )
    head, variables = _target_and_variables(text, where)
    if head.endswith(".mlir"):
        path = _find_spec_file(head, schedules_dir, cwd, where)
        return [_transform_stage(path, variables, spec, where)]
    if head.endswith(".yaml"):
        path = _find_spec_file(head, schedules_dir, cwd, where)
        return _expand_file(path, schedules_dir, variables, overrides=True)
    if _PASS_NAME.fullmatch(text) and (schedules_dir / f"{text}.yaml").is_file():
        return _expand_file((schedules_dir / f"{text}.yaml").resolve(), schedules_dir)
    name = text.split("{", 1)[0].strip()
    if not _PASS_NAME.fullmatch(name):
        raise InputError(f"{where}: no such descriptor file or pass name")
    return [Stage("pass", _normalise_pass(text, where), spec)]


def _is_python(text: str) -> bool:
    """Whether a spec names a Python schedule generator, e.g. `gen.py[gen=f]{opt}`."""
    return re.split(r"[\[{]", text, maxsplit=1)[0].strip().endswith(".py")


def _find_spec_file(text: str, schedules_dir: Path, cwd: Path, where: str) -> Path:
    """A command-line file: relative to the CWD (or absolute), else to the schedules dir."""
    for candidate in (cwd / text, schedules_dir / text):
        if candidate.is_file():
            return candidate.resolve()
    raise InputError(f"{where}: no such descriptor file or pass name")


# --- descriptor files -----------------------------------------------------------------------


def _expand_file(
    path: Path,
    schedules_dir: Path,
    variables: dict[str, str] | None = None,
    chain: tuple[Path, ...] = (),
    *,
    overrides: bool = False,
) -> list[Stage]:
    """Flat stages of one descriptor file, with its variables substituted: its own `Vars`
    defaults, overridden by the includer's (or, `overrides`, the command line's) values."""
    document = load(path)
    defaults = {name: str(value) for name, value in document.get("Vars", {}).items()}
    if overrides:
        unknown = sorted(set(variables or {}) - set(defaults))
        if unknown:
            declared = ", ".join(sorted(defaults)) or "none"
            raise InputError(f"{path}: no variable {unknown[0]!r} to set (its Vars: {declared})")
    variables = {**defaults, **(variables or {})}
    stages: list[Stage] = []
    for index, entry in enumerate(document["Pipeline"]):
        where = f"{path}: Pipeline entry {index + 1}"
        key, value = _split_entry(entry, where)
        value = _substitute(value, variables or {}, where)
        if key == "pass":
            stages.append(Stage("pass", _normalise_pass(value, where), str(path)))
        elif key == "transform":
            script, script_variables = _transform_path(value, path, schedules_dir, where)
            stages.append(_transform_stage(script, script_variables, str(path), where))
        else:
            stages += _expand_include(value, path, schedules_dir, (*chain, path), where)
    return stages


def load(path: Path) -> dict:
    """A descriptor file as a mapping, checked for shape: `Pipeline` (a non-empty list),
    `Vars` (a mapping of names to scalars) and `Tune` (left to kbd.plan.space)."""
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: descriptor file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read descriptor: {exc}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: YAML syntax error{_yaml_location(exc)}") from None
    if not isinstance(document, dict) or "Pipeline" not in document:
        raise InputError(f"{path}: expected a mapping with a 'Pipeline' key")
    extra = sorted(str(key) for key in document if key not in _TOP_LEVEL)
    if extra:
        raise InputError(f"{path}: unknown top-level key {extra[0]!r} (Pipeline, Vars, Tune)")
    entries = document["Pipeline"]
    if not isinstance(entries, list):
        raise InputError(f"{path}: 'Pipeline' must be a list of entries")
    if not entries:
        raise InputError(f"{path}: 'Pipeline' is empty")
    variables = document.get("Vars", {})
    if not isinstance(variables, dict) or not all(
        isinstance(k, str)
        and _VARIABLE_NAME.fullmatch(k)
        and isinstance(v, int | float | str)
        and not isinstance(v, bool)
        for k, v in variables.items()
    ):
        raise InputError(f"{path}: 'Vars' must map variable names to numbers or strings")
    return document


def _yaml_location(exc: yaml.YAMLError) -> str:
    """' at line N: problem' for a YAML error, as one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    line = f" at line {mark.line + 1}" if mark is not None else ""
    return f"{line}: {problem}"


def _split_entry(entry: object, where: str) -> tuple[str, str]:
    """The (key, value) of one `- key: value` entry."""
    if not isinstance(entry, dict) or len(entry) != 1:
        raise InputError(f"{where}: expected a single-key mapping like 'pass: name'")
    ((key, value),) = entry.items()
    if key not in ("pass", "transform", "include"):
        raise InputError(f"{where}: unknown key {key!r} (expected pass, transform or include)")
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where}: the value of {key!r} must be a non-empty string")
    return key, value.strip()


def _substitute(text: str, variables: dict[str, str], where: str) -> str:
    """Replace each `$name` by its include variable; an unknown name is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            raise InputError(f"{where}: unresolved variable ${name} (not set by its user)")
        return variables[name]

    return _VARIABLE.sub(replace, text)


def _expand_include(
    value: str, including: Path, schedules_dir: Path, chain: tuple[Path, ...], where: str
) -> list[Stage]:
    """Stages of an `include: other.yaml {var=value}` entry."""
    target, variables = _target_and_variables(value, where)
    if not target.endswith(".yaml"):
        raise InputError(f"{where}: include expects a .yaml descriptor, got {target!r}")
    path = _locate(target, including, schedules_dir, where)
    if path in chain:
        cycle = " -> ".join(p.name for p in (*chain, path))
        raise InputError(f"{where}: include cycle {cycle}")
    return _expand_file(path, schedules_dir, variables, chain)


def _transform_stage(script: Path, variables: dict[str, str], source: str, where: str) -> Stage:
    """A transform stage carrying its script's text (jobs are self-contained), with the
    entry's variables substituted into it."""
    try:
        text = script.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot read transform script {script}: {exc}") from None
    text = _substitute(text, variables, f"{where}: {script}")
    return Stage("transform", str(script), source, script=text)


def _target_and_variables(value: str, where: str) -> tuple[str, dict[str, str]]:
    """The file and the `{var=value ...}` of an include or transform entry, checked."""
    target, options = _split_braces(value, where)
    variables = {}
    for name, text in options:
        if not _VARIABLE_NAME.fullmatch(name):
            raise InputError(f"{where}: bad variable name {name!r}")
        variables[name] = text
    return target, variables


def _transform_path(
    value: str, including: Path, schedules_dir: Path, where: str
) -> tuple[Path, dict[str, str]]:
    """The absolute path and the variables of a `transform: script.mlir {var=value}` entry."""
    if _is_python(value):
        raise InputError(
            f"{where}: Python schedule generators are not supported; use a .mlir transform script"
        )
    target, variables = _target_and_variables(value, where)
    if not target.endswith(".mlir") or "[" in target:
        raise InputError(f"{where}: transform expects a .mlir script path, got {value!r}")
    return _locate(target, including, schedules_dir, where), variables


def _locate(relative: str, including: Path, schedules_dir: Path, where: str) -> Path:
    """A file next to the including descriptor, else in the schedules dir."""
    for base in (including.parent, schedules_dir):
        candidate = base / relative
        if candidate.is_file():
            return candidate.resolve()
    raise InputError(f"{where}: file {relative!r} not found next to it or in {schedules_dir}")


# --- stage strings --------------------------------------------------------------------------


def _normalise_pass(text: str, where: str) -> str:
    """`name{k=v flag}` as `name{k=v flag=true}`; `name` alone if there are no options."""
    name, options = _split_braces(text, where)
    if not _PASS_NAME.fullmatch(name):
        raise InputError(f"{where}: bad pass name {name!r}")
    for key, _ in options:
        if not _OPTION_KEY.fullmatch(key):
            raise InputError(f"{where}: bad option name {key!r} for pass {name}")
    if not options:
        return name
    return name + "{" + " ".join(f"{key}={value}" for key, value in options) + "}"


def _split_braces(text: str, where: str) -> tuple[str, list[tuple[str, str]]]:
    """Split `head{k=v flag}` into the stripped head and its options, checking the braces."""
    head, brace, rest = text.partition("{")
    if not brace:
        if "}" in text:
            raise InputError(f"{where}: unbalanced braces in {text!r}")
        return head.strip(), []
    body = rest.rstrip()
    if not body.endswith("}"):
        raise InputError(f"{where}: unbalanced braces in {text!r}")
    return head.strip(), _parse_options(body[:-1], text, where)


def _parse_options(body: str, text: str, where: str) -> list[tuple[str, str]]:
    """Parse `k=v flag k2=[1, 2]` into [(k, v), (flag, "true"), (k2, "[1,2]")]."""
    options: dict[str, str] = {}
    for token in _tokens(body, text, where):
        parts = _split_top_level(token, "=")
        if len(parts) > 2 or not parts[0]:
            raise InputError(f"{where}: malformed option {token!r} in {text!r}")
        key = parts[0]
        value = parts[1] if len(parts) == 2 else "true"
        if not value:
            raise InputError(f"{where}: option {key!r} has no value in {text!r}")
        if key in options:
            raise InputError(f"{where}: option {key!r} given twice in {text!r}")
        options[key] = value.lower() if value.lower() in _BOOLEANS else value
    return list(options.items())


def _tokens(body: str, text: str, where: str) -> list[str]:
    """Split on whitespace outside brackets; whitespace inside brackets is dropped."""
    tokens, current, depth = [], "", 0
    for char in body:
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth < 0:
                raise InputError(f"{where}: unbalanced braces in {text!r}")
        if char.isspace():
            if depth == 0 and current:
                tokens.append(current)
                current = ""
            continue
        current += char
    if depth != 0:
        raise InputError(f"{where}: unbalanced braces in {text!r}")
    return [*tokens, current] if current else tokens


def _split_top_level(token: str, separator: str) -> list[str]:
    """Split `token` on `separator` where it is not nested in brackets."""
    parts, current, depth = [], "", 0
    for char in token:
        depth += (char in _OPEN) - (char in _CLOSE)
        if char == separator and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]
