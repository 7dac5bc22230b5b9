"""The worker side: what runs in the template and the sandboxed workers it forks (torch and
torch-mlir live here, and nowhere else).

It imports nothing of the supervisor's but the contract, `kbd.shared`.

Its modules, one line each:
- `template`: the warm process that imports torch and torch-mlir once and forks the workers
- `child`: a worker's life after the fork: take the job, sandbox, run, report
- `sandbox`: limits a worker applies to itself (memory, cores, no core dumps, parent death)
- `contain`: containment of the kernel a worker runs: filesystem, network, temporary files
- `landlock`: Landlock through raw syscalls, for `contain` (read-only filesystem, no TCP)
- `seccomp`: a seccomp filter that makes socket(2) fail, for `contain`
- `job`: one kernel's phases, import mode or compile mode, then bench when asked
- `ingress`: from a KernelBench problem file to a torch model, its inputs and eager reference
- `sizing`: a problem's own inputs and one forward measured on the meta device, not made
  (`--shapes kernelbench`)
- `state`: model state and randomness in `forward` made explicit, for both modes
- `decompositions`: decompositions applied at import (cumsum and cumprod; sums in blocks)
- `norms`: decompositions of the norms into f32 reductions, applied at import
- `low_precision`: bf16 and f16 reductions, products and norms accumulate in f32 at import
- `cached_import`: the import step with the import cache (the supervisor's module, or afresh)
- `mlir`: all MLIR access (a package: import, calling convention, rewrites, stages, execution)
- `stages`: a kernel's pipeline stages run so they can be seen and reproduced (bundles, replay)
- `runtime`: symbols the JIT code calls that the torch-mlir wheel lacks (OpenMP, C runner utils)
- `library`: compiled code as a shared library, the worker's side of the compile cache
- `dynamo`: compile mode, kbd as a torch.compile (Dynamo) backend
- `families`: a kernel's schedule family from the dominant op of its exported graph
- `check`: comparison of compiled outputs with the eager reference
- `bench`: timing a passing kernel against PyTorch eager, in either mode
- `generate`: the torch side of `kbd levels generate`: measuring one KernelBench problem
- `knobs`: the size constants of a problem file and how to reduce them (pure `ast`)
- `probe_kernel`: the problem `kbd doctor` runs in real workers to test enforcement
"""
