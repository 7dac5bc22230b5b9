"""Checked allocations: compiled code that cannot allocate a buffer says so instead of crashing.

`finalize-memref-to-llvm` lowers `memref.alloc` to a call of `malloc` (`aligned_alloc` with
`use-aligned-alloc`) and never looks at what it returned: under `--mem-limit` (RLIMIT_DATA) an
allocation past the cap is NULL, and the code dies of SIGSEGV writing through it, a `crash`
that is really `memory`. `check_allocations` routes the module's calls of these allocators
through a wrapper defined in the module itself: it calls the allocator and, only when that
returned NULL, calls the function whose address is in the module's global `FAILURE_HOOK`
with the requested size (the worker's `kbd.worker.runtime.allocation_failed`, which ends the
kernel as `memory`). The fast path is the allocator's call plus one compare and branch (weighted
as unlikely); the wrapper is internal, so LLVM inlines it.

The hook is a global the worker fills after loading the code, not an external function: the
same code then works from the ExecutionEngine and from a shared library of the compile cache
(kbd.worker.library), which the dynamic loader must resolve completely (a symbol only the
engine provides would make it unloadable). Its name starts with the engine's packed-interface
prefix because `ExecutionEngine.raw_lookup` prepends it: `raw_lookup(HOOK_LOOKUP)` finds it.
With the hook unset (NULL), a failed allocation returns NULL as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from kbd.worker.mlir.convention import PACKED_PREFIX

HOOK_LOOKUP = "kbd_allocation_failed"  # as ExecutionEngine.raw_lookup takes it
FAILURE_HOOK = PACKED_PREFIX + HOOK_LOOKUP  # the global's symbol (in a library: ctypes in_dll)
WRAPPER_PREFIX = "kbd_checked_"
# The failure branch's weight against the success branch: LLVM lays it out of the hot path.
_UNLIKELY = "weights([1, 1048575])"


@dataclass(frozen=True)
class Allocator:
    """An allocation function the lowering calls: its parameter types and which is the size."""

    name: str
    params: tuple[str, ...]
    size: int  # index of the size parameter

    @property
    def declaration(self) -> str:
        """The function type of its declaration in a module lowered to LLVM."""
        return f"!llvm.func<ptr ({', '.join(self.params)})>"


ALLOCATORS = (
    Allocator("malloc", ("i64",), size=0),
    Allocator("aligned_alloc", ("i64", "i64"), size=1),
)


def check_allocations(module: ir.Module) -> list[str]:
    """Route every call of an allocator the module declares through its checking wrapper (and
    add the hook global); returns the allocators checked. A module without them is unchanged,
    and so is a declaration of another type than the lowering emits (e.g. a 32-bit index)."""
    declared = _declarations(module)
    checked = [a for a in ALLOCATORS if declared.get(a.name) == a.declaration]
    if not checked:
        return []
    with module.context, ir.Location.unknown():
        for allocator in checked:  # before the wrappers exist: their own calls stay direct
            ir.SymbolTable.replace_all_symbol_uses(
                allocator.name, WRAPPER_PREFIX + allocator.name, module.operation
            )
        text = "\n".join([_HOOK, *(_wrapper(a) for a in checked)])
        definitions = ir.Module.parse("\n".join([*(_declare(a) for a in checked), text]))
        point = ir.InsertionPoint(module.body)
        for op in list(definitions.body.operations)[len(checked) :]:  # not the declarations
            point.insert(op.operation.clone())
    return [a.name for a in checked]


def _declarations(module: ir.Module) -> dict[str, str]:
    """Name -> function type of each `llvm.func` the module declares without a body."""
    found = {}
    for op in module.body.operations:
        if op.operation.name == "llvm.func" and not op.regions[0].blocks:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            found[name] = str(ir.TypeAttr(op.attributes["function_type"]).value)
    return found


_HOOK = f"""\
llvm.mlir.global external @{FAILURE_HOOK}() {{addr_space = 0 : i32}} : !llvm.ptr {{
  %null = llvm.mlir.zero : !llvm.ptr
  llvm.return %null : !llvm.ptr
}}"""


def _declare(allocator: Allocator) -> str:
    return f"llvm.func @{allocator.name}({', '.join(allocator.params)}) -> !llvm.ptr"


def _wrapper(allocator: Allocator) -> str:
    """The allocator's checking wrapper, with its own signature."""
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(allocator.params))
    args = ", ".join(f"%a{i}" for i in range(len(allocator.params)))
    types = ", ".join(allocator.params)
    return f"""\
llvm.func internal @{WRAPPER_PREFIX}{allocator.name}({params}) -> !llvm.ptr {{
  %pointer = llvm.call @{allocator.name}({args}) : ({types}) -> !llvm.ptr
  %null = llvm.mlir.zero : !llvm.ptr
  %failed = llvm.icmp "eq" %pointer, %null : !llvm.ptr
  llvm.cond_br %failed {_UNLIKELY}, ^report, ^done
^report:
  %address = llvm.mlir.addressof @{FAILURE_HOOK} : !llvm.ptr
  %hook = llvm.load %address : !llvm.ptr -> !llvm.ptr
  %unset = llvm.icmp "eq" %hook, %null : !llvm.ptr
  llvm.cond_br %unset, ^done, ^call
^call:
  llvm.call %hook(%a{allocator.size}) : !llvm.ptr, (i64) -> ()
  llvm.br ^done
^done:
  llvm.return %pointer : !llvm.ptr
}}"""
