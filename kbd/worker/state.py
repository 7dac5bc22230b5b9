"""Model state and randomness in `forward`, made explicit so compiled code and eager compare
like with like (both modes).

- Plain tensor attributes (`self.hidden = torch.randn(...)` in `__init__`) become registered
  buffers, so torch.export treats their mutation as a buffer mutation instead of refusing a
  mutated constant, and Dynamo and export pass them to compiled code as arguments.
- The model's buffers are snapshotted before the eager reference and restored before each
  compiled call, so a forward that updates state (an RNN's hidden state, BatchNorm statistics)
  starts from the same state in both.
- Random ops in `forward` draw different numbers in compiled code than in eager. Eager's draws
  are recorded during the reference and fed to the imported function as extra inputs
  (`RandomAsInputs`); compile mode draws them in eager at call time from the same RNG state.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

# Functional random ops whose result can be replaced by a tensor drawn by eager.
RANDOM_OPS = frozenset(
    {
        torch.randn,
        torch.rand,
        torch.randint,
        torch.randn_like,
        torch.rand_like,
        torch.randint_like,
        torch.normal,
        torch.bernoulli,
        torch.multinomial,
        torch.poisson,
        torch.randperm,
    }
)


def register_tensor_attributes(model: torch.nn.Module) -> list[str]:
    """Turn every plain tensor attribute of every submodule into a registered buffer.

    Returns the qualified names of the attributes converted.
    """
    converted = []
    for prefix, module in model.named_modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                delattr(module, name)
                module.register_buffer(name, value)
                converted.append(f"{prefix}.{name}" if prefix else name)
    return converted


def snapshot_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every buffer, to restore with `restore_buffers`."""
    return {name: b.detach().clone() for name, b in model.named_buffers()}


def restore_buffers(model: torch.nn.Module, snapshot: dict[str, torch.Tensor]) -> None:
    """Put the buffers back as they were, including ones forward rebound to new tensors."""
    for qualified, value in snapshot.items():
        owner, _, name = qualified.rpartition(".")
        module = model.get_submodule(owner) if owner else model
        module._buffers[name] = value.clone()


class RecordRandom(TorchFunctionMode):
    """Runs everything as usual and keeps a copy of the result of every random op."""

    def __init__(self):
        super().__init__()
        self.draws: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func in RANDOM_OPS:
            self.draws.append(result.detach().clone())
        return result


class _ReplayRandom(TorchFunctionMode):
    """Returns the given tensors, in order, in place of random ops."""

    def __init__(self, draws):
        super().__init__()
        self.draws = list(draws)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in RANDOM_OPS:
            if not self.draws:
                raise RuntimeError(f"forward drew more random tensors than eager did ({func})")
            return self.draws.pop(0)
        return func(*args, **(kwargs or {}))


class RandomAsInputs(torch.nn.Module):
    """The model with its random ops' results taken from `count` trailing arguments."""

    def __init__(self, model: torch.nn.Module, count: int):
        super().__init__()
        self.model = model
        self.count = count

    def forward(self, *args):
        split = len(args) - self.count
        with _ReplayRandom(args[split:]):
            return self.model(*args[:split])
