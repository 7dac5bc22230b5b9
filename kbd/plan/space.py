"""The search space a tunable descriptor declares: its `Tune` section, read and enumerated.

    Vars: {block_m: 256, reg_m: 8, reg_n: 32}        # the defaults: the untuned schedule
    Tune:
      space:
        block_m: [64, 128, 256]                      # a list of values
        reg_n: {pow2: [16, 64]}                      # powers of two from 16 to 64
      constraints:
        - reg_m * reg_n / lanes <= vregs - 4         # over the variables and the target
        - block_m % reg_m == 0

Every variable of `space` must be one of the descriptor's `Vars`; the others keep their
defaults. A constraint is a Python expression over the variables and the target's `lanes`
(f32 lanes of its widest vectors) and `vregs` (vector registers), using numbers, arithmetic,
comparisons, `and`, `or`, `not`, `min` and `max`; nothing else is evaluated. The default
configuration is always part of the space, first, even if a constraint rejects it.
Pure Python: the supervisor reads spaces without torch or MLIR.
"""

from __future__ import annotations

import ast
import itertools
import operator
from collections.abc import Iterable
from pathlib import Path

import msgspec

from kbd.plan import descriptor
from kbd.shared.errors import InputError

Config = dict[str, int | float | str]

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS = {"min": min, "max": max}
MAX_POINTS = 100_000  # a space larger than this is an error in its descriptor


class Target(msgspec.Struct, frozen=True):
    """What constraints may ask of the CPU: f32 lanes of its widest vectors, vector registers."""

    lanes: int
    vregs: int


def target_for(features: Iterable[str]) -> Target:
    """The constraint target of a CPU with these ranked features (or a feature directory)."""
    present = set(features)
    if present & {"avx512f", "avx512_bf16", "amx_bf16"}:
        return Target(lanes=16, vregs=32)
    return Target(lanes=8, vregs=16)


class Space(msgspec.Struct, frozen=True):
    """A descriptor's tunable variables, their domains and constraints, and its defaults."""

    path: str
    defaults: Config
    domains: dict[str, list]
    constraints: list[str]

    def size(self) -> int:
        """How many configurations the domains span, before constraints."""
        count = 1
        for values in self.domains.values():
            count *= len(values)
        return count

    def default(self) -> Config:
        """The untuned configuration: the tuned variables at their defaults."""
        return {name: self.defaults[name] for name in self.domains}

    def valid(self, config: Config, target: Target) -> str | None:
        """None when `config` meets every constraint on `target`, else the first it breaks."""
        names = {**self.defaults, **config, "lanes": target.lanes, "vregs": target.vregs}
        for constraint in self.constraints:
            if not _evaluate(ast.parse(constraint, mode="eval").body, names, constraint):
                return constraint
        return None

    def configs(self, target: Target) -> list[Config]:
        """Every valid configuration, the default first, then in domain order."""
        default = self.default()
        found = [default]
        names = list(self.domains)
        for values in itertools.product(*(self.domains[n] for n in names)):
            config = dict(zip(names, values, strict=True))
            if config != default and self.valid(config, target) is None:
                found.append(config)
        return found


def load(path: Path) -> Space | None:
    """The space of the descriptor at `path`, or None when it declares none."""
    document = descriptor.load(path)
    tune = document.get("Tune")
    if tune is None:
        return None
    where = f"{path}: Tune"
    if not isinstance(tune, dict) or set(tune) - {"space", "constraints"} or "space" not in tune:
        raise InputError(f"{where}: expected a mapping with 'space' and optional 'constraints'")
    defaults = dict(document.get("Vars", {}))
    if not isinstance(tune["space"], dict) or not tune["space"]:
        raise InputError(f"{where}: 'space' must map variables to their domains")
    domains = {}
    for name, domain in tune["space"].items():
        if name not in defaults:
            raise InputError(f"{where}: {name!r} is not one of the descriptor's Vars")
        domains[name] = _domain(domain, f"{where}: {name}")
    constraints = tune.get("constraints", [])
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise InputError(f"{where}: 'constraints' must be a list of expressions")
    space = Space(str(path), defaults, domains, constraints)
    known = {*defaults, "lanes", "vregs"}
    for constraint in constraints:
        _check_expression(constraint, known, f"{where}: constraint {constraint!r}")
    if space.size() > MAX_POINTS:
        raise InputError(f"{where}: {space.size()} configurations; at most {MAX_POINTS}")
    return space


def _domain(domain: object, where: str) -> list:
    if isinstance(domain, list) and domain and all(_scalar(v) for v in domain):
        if len(set(domain)) != len(domain):
            raise InputError(f"{where}: a value is listed twice")
        return domain
    if isinstance(domain, dict) and list(domain) == ["pow2"]:
        bounds = domain["pow2"]
        if (
            isinstance(bounds, list)
            and len(bounds) == 2
            and all(isinstance(b, int) and b > 0 and b & (b - 1) == 0 for b in bounds)
            and bounds[0] <= bounds[1]
        ):
            low, high = bounds
            return [1 << e for e in range(low.bit_length() - 1, high.bit_length())]
    raise InputError(f"{where}: a domain is a list of values or {{pow2: [low, high]}}")


def _scalar(value: object) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)


def _check_expression(text: str, names: set[str], where: str) -> None:
    """Parse a constraint and check that it uses only what `_evaluate` allows."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise InputError(f"{where}: not an expression") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in names and node.id not in _FUNCTIONS:
            raise InputError(f"{where}: unknown name {node.id!r}")
        allowed = (
            ast.Expression,
            ast.BoolOp,
            ast.And,
            ast.Or,
            ast.UnaryOp,
            ast.Not,
            ast.USub,
            ast.BinOp,
            ast.Compare,
            ast.Name,
            ast.Load,
            ast.Constant,
            ast.Call,
            *_BINARY,
            *_COMPARE,
        )
        if not isinstance(node, allowed):
            raise InputError(f"{where}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Call) and (
            not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords
        ):
            raise InputError(f"{where}: only min(...) and max(...) may be called")


def _evaluate(node: ast.AST, names: dict, text: str):
    """The value of a checked constraint expression (see `_check_expression`)."""
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return names[name]
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _evaluate(operand, names, text)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_evaluate(operand, names, text)
        case ast.BoolOp(op=ast.And(), values=values):
            return all(_evaluate(v, names, text) for v in values)
        case ast.BoolOp(op=ast.Or(), values=values):
            return any(_evaluate(v, names, text) for v in values)
        case ast.BinOp(left=left, op=op, right=right):
            try:
                return _BINARY[type(op)](
                    _evaluate(left, names, text), _evaluate(right, names, text)
                )
            except (ZeroDivisionError, TypeError):
                return False
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            value = _evaluate(left, names, text)
            for op, comparator in zip(ops, comparators, strict=True):
                other = _evaluate(comparator, names, text)
                if not _COMPARE[type(op)](value, other):
                    return False
                value = other
            return True
        case ast.Call(func=ast.Name(id=function), args=args):
            return _FUNCTIONS[function](*(_evaluate(a, names, text) for a in args))
    raise InputError(f"constraint {text!r}: cannot evaluate {type(node).__name__}")


def spec(path: str, config: Config) -> str:
    """The pipeline spec of `config` (what `--pipeline` takes): `path{name=value ...}`."""
    if not config:
        return path
    return path + "{" + " ".join(f"{name}={value}" for name, value in sorted(config.items())) + "}"
