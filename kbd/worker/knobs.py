"""Knobs: the integer constants of a KernelBench problem file that set its sizes (pure `ast`).

The reduction policy (README "Levels files"): the sizes live in module-level constants
(`batch_size = 128`, `height, width = (32, 32)`, `input_shape = (4096,)`, ...) and in a few
integer literals inside get_inputs() (`torch.rand(batch_size, 3, 224, 224)`). Every such integer
is a knob with a category taken from its name (see CATEGORIES):

    batch    batch_size, b
    spatial  height, width, depth, D/H/W, dim1..3, length, seq_len, ...; integer literals
             >= 16 in get_inputs() or in `input_shape = (batch_size, 3, 224, 224)`
    feature  channels, features, hidden/input/output sizes, M/N/K, embedding dims, ...
    fixed    everything else: kernel sizes, strides, paddings, dilations, groups, heads,
             num_groups, layer counts, axis numbers (`dim = 1`), constants of the math.

Knobs whose value refers to other names (`bias_shape = (out_channels, 1, 1)`) are not knobs;
they are recomputed from the reduced knobs when the module is re-executed. A kernel over its
budget is reduced in STAGES, stopping as soon as it fits:

    1. batch   halved, floor 8                  4. batch   halved, floor 1
    2. spatial halved, floor 32                 5. spatial halved, floor 8
    3. feature halved, floor 64                 6. feature halved, floor 16
    7. last resort: batch, spatial and feature knobs halved together, each clamped at its
       stage 4-6 floor (a problem whose sizes are tied across categories, e.g. L1/100).

Stages 1-6 halve all knobs of their category together (odd sizes stay odd: 8205 -> 4103);
knobs already at or below the floor never change, and a step that would take any other knob
below the floor is refused. So ratios survive: square stays square, "large K" keeps K the
largest dimension, tall-skinny stays tall-skinny, power-of-two sizes stay divisible by
groups/heads. This module imports neither torch nor anything that does.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

# (category, floor) per stage; a knob never goes below min(original, floor).
STAGES = (
    ("batch", 8),
    ("spatial", 32),
    ("feature", 64),
    ("batch", 1),
    ("spatial", 8),
    ("feature", 16),
    ("all", 0),  # last resort: batch, spatial and feature knobs halved together (hard floors)
)
HARD_FLOORS = {"batch": 1, "spatial": 8, "feature": 16}
LITERAL_MIN = 16  # integer literals >= this inside get_inputs() are spatial knobs

CATEGORIES = {
    "batch": {"batch_size", "b"},
    "spatial": {
        "height", "width", "depth", "D", "H", "W", "dim1", "dim2", "dim3", "length",
        "input_length", "sequence_length", "seq_len", "seq_length", "max_seqlen", "height_in",
        "width_in", "depth_in", "image_height", "image_width", "image_size", "i", "j",
        "num_features",
    },
    "feature": {
        "in_channels", "out_channels", "channels", "input_channels", "features", "in_features",
        "out_features", "input_size", "hidden_size", "output_size", "num_classes",
        "output_classes", "M", "N", "K", "L", "m", "n", "k", "l", "dim", "embedding_dimension",
        "n_embd", "embed_dim", "mlp_dim", "growth_rate", "num_input_features",
        "num_output_features", "squeeze_channels", "expand1x1_channels", "expand3x3_channels",
        "out_1x1", "reduce_3x3", "out_3x3", "reduce_5x5", "out_5x5", "pool_proj", "feature_size",
        "num_clusters", "ghost_clusters", "d_head", "d_state", "input_shape", "layer_sizes",
        "hidden_layer_sizes", "block_widths",
    },
}  # fmt: skip
AXIS_MAX = 4  # `dim = 1` (an axis number) is fixed; `dim = 16384` (a size) is a feature


@dataclass
class Knob:
    name: str
    category: str
    value: int | tuple[int, ...]  # a tuple for `input_shape = (4096,)`-style constants
    kind: str  # "assign" (also `a = b = 1`) | "unpack" | "element" (of a tuple) | "literal"
    index: int  # position in the file's knob list (for locating the AST node again)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _literal_value(node: ast.expr):
    """The value of a constant expression without names (`1024 * 2`, `(32768,)`), else None."""
    if _has_name(node):
        return None
    try:
        value = eval(compile(ast.Expression(node), "<knob>", "eval"), {"__builtins__": {}})
    except Exception:
        return None
    if is_int(value):
        return value
    if isinstance(value, tuple | list) and value and all(is_int(v) for v in value):
        return tuple(value)
    return None


def _category(name: str, value) -> str:
    if name == "dim" and is_int(value) and value <= AXIS_MAX:
        return "fixed"
    for category, names in CATEGORIES.items():
        if name in names:
            return category
    return "fixed"


def _has_name(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) for n in ast.walk(node))


def _big_literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and is_int(node.value) and node.value >= LITERAL_MIN


def _knob_sites(tree: ast.Module):
    """Yield (name, kind, getter/setter target) for every integer site, in file order."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) > 1:
            if all(isinstance(t, ast.Name) for t in node.targets):  # height = width = 256
                yield "=".join(t.id for t in node.targets), "assign", node, None
        elif isinstance(node, ast.Assign):
            target = node.targets[0]
            if isinstance(target, ast.Name):
                yield target.id, "assign", node, None
                if isinstance(node.value, ast.Tuple | ast.List) and _has_name(node.value):
                    # input_shape = (batch_size, 3, 224, 224): the big literals are spatial
                    for pos, elt in enumerate(node.value.elts):
                        if _big_literal(elt):
                            yield f"{target.id}[{pos}]", "element", node, pos
            elif (
                isinstance(target, ast.Tuple)
                and isinstance(node.value, ast.Tuple)
                and len(target.elts) == len(node.value.elts)
            ):
                for pos, elt in enumerate(target.elts):
                    if isinstance(elt, ast.Name):
                        yield elt.id, "unpack", node, pos
        elif isinstance(node, ast.FunctionDef) and node.name == "get_inputs":
            skip = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("randint"):
                    skip.update(id(a) for a in ast.walk(sub) if a is not sub)
            count = 0
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and id(sub) not in skip:
                    for pos, arg in enumerate(sub.args):
                        if _big_literal(arg):
                            yield f"get_inputs#{count}", "literal", sub, pos
                            count += 1


def find_knobs(tree: ast.Module) -> list[Knob]:
    knobs = []
    for index, (name, kind, node, pos) in enumerate(_knob_sites(tree)):
        if kind == "assign":
            value = _literal_value(node.value)
        elif kind == "unpack":
            value = _literal_value(node.value.elts[pos])
        elif kind == "element":
            value = node.value.elts[pos].value
        else:
            value = node.args[pos].value
        if value is None:
            continue
        if kind in ("literal", "element"):
            category = "spatial"
        else:
            categories = [_category(n, value) for n in name.split("=")]
            category = next((c for c in categories if c != "fixed"), "fixed")
        knobs.append(Knob(name, category, value, kind, index))
    return knobs


def _const(value) -> ast.expr:
    if isinstance(value, tuple):
        return ast.Tuple([ast.Constant(v) for v in value], ast.Load())
    return ast.Constant(value)


def apply_overrides(tree: ast.Module, values: dict[int, object]) -> ast.Module:
    """A copy of `tree` with the knobs at the given indexes set to new values."""
    tree = copy.deepcopy(tree)
    for index, (_name, kind, node, pos) in enumerate(_knob_sites(tree)):
        if index not in values:
            continue
        new = values[index]
        if kind == "assign":
            old = node.value
            if isinstance(new, tuple) and isinstance(old, ast.List):
                node.value = ast.List([ast.Constant(v) for v in new], ast.Load())
            else:
                node.value = _const(new)
        elif kind == "unpack":
            node.value.elts[pos] = _const(new)
        elif kind == "element":
            node.value.elts[pos] = ast.Constant(new)
        else:
            node.args[pos] = ast.Constant(new)
    return ast.fix_missing_locations(tree)


def halve(value: int, floor: int, strict: bool = False) -> int | None:
    """Half of `value` (odd stays odd: 8205 -> 4103), never below min(value, floor).

    With `strict`, a value that would drop below `floor` gives None (the step is refused).
    """
    half = value // 2
    if value % 2 and half % 2 == 0 and half > 0:
        half += 1
    if half >= floor:
        return half
    return None if strict else max(half, min(value, floor))


def halve_knob(value, original, floor: int, strict: bool = False):
    """Halve a knob (int or tuple of ints); knobs whose original is <= floor never change."""
    if isinstance(value, tuple):
        out = tuple(
            v if o <= floor else halve(v, floor, strict)
            for v, o in zip(value, original, strict=True)
        )
        return None if None in out else out
    return value if original <= floor else halve(value, floor, strict)
