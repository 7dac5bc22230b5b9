"""Compile mode: kbd as a torch.compile (Dynamo) backend.

Dynamo captures the model's forward as one or more FX graphs (more than one when it breaks the
graph at Python it cannot trace) and hands each to `Backend`, which takes it through the same
path as import mode: torch.export with kbd's decompositions into linalg (`mlir.import_program`),
the kernel's pipeline stages, the MLIR JIT. Python runs whatever Dynamo left to eager.

Static shapes only (`dynamic=False`); RNN modules are traced (`allow_rnn`); hitting the
recompile limit is an error, never a silent fallback to eager. What was compiled and what ran
in eager is measured (`Coverage`): subgraphs and their FX ops from the backend, graph breaks
from Dynamo's counters, and the aten ops that ran outside compiled subgraphs from a profile of
one forward.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections import Counter
from collections.abc import Callable

import numpy as np
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from kbd.shared.protocol import Coverage
from kbd.worker import ingress, mlir, runtime, state
from kbd.worker.stages import Pipeline

MLIR_SCOPE = "kbd::mlir"  # profiler scope around compiled subgraphs: ops inside are not eager
MAX_REASONS = 5


def configure() -> None:
    """Dynamo settings for compile mode; resets Dynamo's caches and counters.

    Also turns off the fused inference fast path of nn.MultiheadAttention and
    nn.TransformerEncoderLayer (`torch.backends.mha`): traced by Dynamo, they would call
    `aten._transformer_encoder_layer_fwd`, which torch-mlir can neither lower nor decompose
    (torch.export never takes that path). Dynamo guards on the setting, so it stays off for
    compiled calls; `eager_settings()` turns it back on where eager runs as users run it.
    """
    torch._dynamo.reset()
    counters.clear()
    config = torch._dynamo.config
    config.allow_rnn = True  # compile nn.LSTM/GRU/RNN instead of running them in eager
    config.fail_on_recompile_limit_hit = True
    config.suppress_errors = False
    torch.backends.mha.set_fastpath_enabled(False)


@contextlib.contextmanager
def eager_settings():
    """Eager as users run it, inside compile mode (the MHA fast path back on)."""
    torch.backends.mha.set_fastpath_enabled(True)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(False)


class Backend:
    """A Dynamo backend that compiles each captured graph through torch-mlir and MLIR."""

    def __init__(self, pipeline: Pipeline, kernel: str, opt_level: int, step: Callable):
        self.pipeline = pipeline
        self.kernel = kernel
        self.opt_level = opt_level
        self.step = step  # the job's phase step: `with step(phase): ...`
        self.graph_ops: list[int] = []  # FX ops of each compiled subgraph
        self.state_writes: list[str] = []
        self.random_inputs = 0
        self.error: BaseException | None = None  # the real failure, before Dynamo wraps it

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        try:
            return self._compile(gm, list(example_inputs))
        except BaseException as exc:
            self.error = exc
            raise

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list):
        if any(
            isinstance(x, torch.SymInt | torch.SymFloat | torch.SymBool) for x in example_inputs
        ):
            raise ValueError("symbolic shapes reached the backend; kbd compiles static shapes")
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        captured = gm
        gm, draws = hoist_random_ops(gm)
        with self.step("import"):
            example = [*example_inputs, *(draw() for draw in draws)]
            program = torch.export.export(gm, tuple(example), strict=False)
            module = mlir.import_program(program)
            mutated = mlir.mutated_inputs(module)
            out_types, in_types = mlir.results_to_out_params(module)
            for t in [*out_types, *in_types]:
                if t.dtype not in ingress.NUMPY_DTYPES:
                    raise TypeError(f"unsupported element type {t.dtype} in a compiled subgraph")
        self.pipeline.run(module, self.kernel, subgraph=len(self.graph_ops))
        with self.step("jit"):
            compiled = mlir.Compiled(
                module, self.opt_level, openmp=runtime.uses_openmp(self.pipeline.stages)
            )
            self.pipeline.compiled(compiled)
        self.step("compile")
        self.graph_ops.append(sum(1 for n in gm.graph.nodes if n.op in _OP_KINDS))
        self.state_writes += [_state_name(names[i]) for i in mutated if i < len(names)]
        self.random_inputs += len(draws)
        return _Subgraph(compiled, out_types, mutated, draws, captured)


_OP_KINDS = ("call_function", "call_method", "call_module")


class _Subgraph:
    """Runs one compiled subgraph on torch tensors; writes mutated inputs back."""

    marked = False  # inside `profile()`: mark each call for the profiler (it costs time)
    tracing = False  # inside `first_forward()`: run Dynamo's graph in eager instead

    def __init__(self, compiled, out_types, mutated, draws, graph):
        self.compiled = compiled
        self.out_types = out_types
        self.mutated = mutated
        self.draws = draws
        self.graph = graph  # Dynamo's FX graph, as captured

    def __call__(self, *args):
        if _Subgraph.tracing:
            return self.graph(*args)
        if _Subgraph.marked:
            with torch.profiler.record_function(MLIR_SCOPE):
                return self._run(args)
        return self._run(args)

    def _run(self, args):
        tensors = [*args, *(draw() for draw in self.draws)]
        inputs = ingress.buffers_from_args(tensors)
        outputs = [np.zeros(t.dims, ingress.NUMPY_DTYPES[t.dtype]) for t in self.out_types]
        self.compiled([*outputs, *inputs])
        results = [ingress.to_torch(o) for o in outputs]
        for j, i in enumerate(self.mutated):  # carry out the state writes, as eager would
            tensors[i].copy_(results[j])
        return tuple(results[len(self.mutated) :])


@contextlib.contextmanager
def first_forward():
    """The forward during which Dynamo traces and compiles. Each compiled subgraph runs its FX
    graph in eager then: its values only steer tracing (past graph breaks) and the state writes,
    as eager's would. The compiled code runs from the next forward on, which is the one checked,
    so a large model runs its compiled code once per check, as in import mode."""
    _Subgraph.tracing = True
    try:
        yield
    finally:
        _Subgraph.tracing = False


@contextlib.contextmanager
def profile():
    """Profile what runs inside (for `eager_ops`), with every compiled subgraph call marked.

    Outside it, subgraph calls are not marked, so that timing does not pay for the mark."""
    _Subgraph.marked = True
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as result:
            yield result
    finally:
        _Subgraph.marked = False


def hoist_random_ops(gm: torch.fx.GraphModule):
    """Replace random ops in a Dynamo graph by trailing inputs drawn by eager at call time.

    Returns (graph module, draws): draws[i]() draws the i-th replaced op's value with eager
    PyTorch, in graph order, so compiled code consumes exactly the numbers eager would draw.
    Only ops whose arguments are constants (or, for `*_like`, a tensor giving only the shape)
    are replaced; Dynamo's graph is copied, never edited (Dynamo keeps state on it).
    """
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in state.RANDOM_OPS]
    if not nodes:
        return gm, []
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in state.RANDOM_OPS]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    draws = []
    for node in nodes:
        draw = _eager_draw(node)
        if draw is None:
            continue
        anchor = placeholders[-1] if placeholders else next(iter(gm.graph.nodes))
        with gm.graph.inserting_after(anchor):
            placeholder = gm.graph.placeholder(f"kbd_random_{len(draws)}")
        placeholder.meta = dict(node.meta)
        node.replace_all_uses_with(placeholder)
        gm.graph.erase_node(node)
        placeholders.append(placeholder)
        draws.append(draw)
    gm.graph.lint()
    gm.recompile()
    return gm, draws


def _eager_draw(node: torch.fx.Node):
    """A function drawing the node's value with eager PyTorch, or None if it depends on data."""
    like = node.target.__name__.endswith("_like")
    args = list(node.args)
    for i, arg in enumerate(args):
        if isinstance(arg, torch.fx.Node):
            value = arg.meta.get("example_value")
            if not (like and i == 0 and isinstance(value, torch.Tensor)):
                return None
            args[i] = (tuple(value.shape), value.dtype)
    if any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()):
        return None
    target, kwargs = node.target, dict(node.kwargs)

    def draw():
        call_args = [torch.empty(a[0], dtype=a[1]) if isinstance(a, tuple) and like else a
                     for a in args]  # fmt: skip
        return target(*call_args, **kwargs)

    return draw


def eager_ops(profile) -> dict[str, int]:
    """aten ops that ran outside compiled subgraphs, by name, from a profile of one forward."""
    found: Counter = Counter()
    for event in profile.events():
        if not event.name.startswith("aten::"):
            continue
        parent = event.cpu_parent
        while parent is not None and not (
            parent.name.startswith("aten::") or parent.name == MLIR_SCOPE
        ):
            parent = parent.cpu_parent
        if parent is None:  # a top-level aten op outside every compiled subgraph
            found[event.name] += 1
    return dict(found)


def coverage(backend: Backend, eager: dict[str, int], finished: bool = True) -> Coverage:
    """What was compiled and what was left to eager, for the record (`finished=False`: what
    was compiled before the kernel failed)."""
    # Dynamo counts unsupported constructs under "unimplemented" and explicit breaks
    # (torch._dynamo.graph_break()) under "graph_break"; a reason in both is counted once.
    reasons: Counter = Counter()
    for kind in ("unimplemented", "graph_break"):
        for reason, n in counters[kind].items():
            reasons[reason] = max(reasons[reason], n)
    return Coverage(
        subgraphs=len(backend.graph_ops),
        graph_ops=sum(backend.graph_ops),
        graph_breaks=sum(reasons.values()),
        break_reasons=[_first_line(r) for r in list(reasons)[:MAX_REASONS]],
        eager_ops=eager,
        finished=finished,
    )


def _state_name(placeholder: str) -> str:
    """'bn.running_mean' from Dynamo's placeholder 'l_self_modules_bn_buffers_running_mean_'."""
    name = re.sub(r"^l_self_|_$", "", placeholder)
    return re.sub(r"(modules|buffers|parameters)_", "", name)


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")
