"""Evidence for the check's tolerance per dtype (issue 27): eager in bf16 and f16 against eager
in f32, over the catalog, in kbd's own tolerance measure.

Each kernel is loaded as a kbd worker loads it (kbd.worker.ingress: seed, problem, model,
inputs, plain tensor attributes registered as buffers; kbd.worker.job `_run` up to the
reference), and its eager output in f32 is taken. A copy of the same model with the same weights
is cast to the low dtype, its floating inputs are cast too (integer inputs are kept), and it runs
in eager from the same RNG state. Three figures per kernel and dtype, each the tolerance t that
kbd's check (`allclose(rtol=atol=t)`, kbd.worker.check) needs, computed by the check itself in
float64:

- vs f32: eager in the low dtype against eager in f32 (f32 as the reference), i.e. how far the
  low-precision result is from the f32 one;
- vs rounded: f32 eager rounded once to the low dtype (and back) against eager in the low dtype
  (the low-dtype eager as the reference, as in a `--dtype` run), i.e. how far a compiled kernel
  that computes in f32 internally and rounds once at the end could be from kbd's reference;
- vs upcast: the same, but the f32 eager runs on the low-dtype weights and inputs (cast back to
  f32), as such a compiled kernel would: without the error of rounding the inputs.

Kernels whose eager run raises in the low dtype (or that have nothing floating to cast) are
listed with the first line of the error. Each (kernel, dtype) runs in its own forked process
with one thread, a timeout and a memory cap (RLIMIT_DATA, as kbd's workers), so one bad kernel
cannot stop the run. Prints the CPU, then per dtype the distribution of each figure, how many
kernels pass at candidate tolerances, the largest needs, and the kernels that cannot run; writes
one JSON line per (kernel, dtype) to --out as results arrive.

    scripts/dtype-tolerance [--levels FILE ...] [--dtype bf16 --dtype f16] [-j 1]
                            [--timeout 60] [--out .kbd/dtype-tolerance.jsonl] [PREFIX ...]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbd.plan import catalog  # noqa: E402  (after the path set-up above)
from kbd.plan.target import cpu_model  # noqa: E402
from kbd.worker import check, ingress, state  # noqa: E402

DTYPES = ("bf16", "f16")
CANDIDATES = (1e-2, 2e-2, 5e-2, 1e-1, 2e-1, 5e-1, 1.0)
PERCENTILES = (50, 90, 95, 99)
FIGURES = (
    ("vs_f32", "eager low vs eager f32"),
    ("vs_rounded", "f32 rounded vs eager low"),
    ("vs_upcast", "f32 on low values, rounded"),
)


# The CPU extensions that decide how eager computes in low precision, named with the CPU.
LOW_PRECISION_FLAGS = (
    "avx512f",
    "avx2",
    "avx512_bf16",
    "amx_bf16",
    "avx512_fp16",
    "amx_fp16",
    "f16c",
)
# ---------------------------------------------------------------- the child: one kernel, one dtype


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line}"[:300]


def _outputs_ok(reference: list[np.ndarray], actual: list[np.ndarray]) -> str | None:
    """Why the two forwards' outputs cannot be compared element by element (None: they can)."""
    if len(reference) != len(actual):
        return f"{len(actual)} outputs, f32 has {len(reference)}"
    for i, (r, a) in enumerate(zip(reference, actual, strict=True)):
        if np.shape(r) != np.shape(a):
            return f"output {i} has shape {np.shape(a)}, f32 has {np.shape(r)}"
    return None


def _figures(reference: list[np.ndarray], actual: list[np.ndarray]) -> dict:
    """kbd's check's error computation: needed tolerance, max abs and max rel error."""
    max_abs, max_rel, needed = check._errors(reference, actual)
    return {"needed": needed, "max_abs": max_abs, "max_rel": max_rel}


def _rounded(outputs: list[np.ndarray], dtype: str) -> list[np.ndarray]:
    """Floating outputs rounded to `dtype` (to nearest even) and back to float32."""
    low = ingress.NUMPY_DTYPES[dtype]
    return [
        o.astype(np.float32).astype(low).astype(np.float32)
        if np.issubdtype(o.dtype, np.floating)
        else o
        for o in outputs
    ]


def _output_dtypes(model) -> list[str]:
    """Filled with the dtypes of the model's outputs each time it runs (a forward hook)."""
    seen: list[str] = []

    def hook(module, inputs, out):
        values = out if isinstance(out, tuple | list) else [out]
        seen[:] = [
            str(getattr(v, "dtype", type(v).__name__)).removeprefix("torch.") for v in values
        ]

    model.register_forward_hook(hook)
    return seen


def _rebuilt(problem, entry: catalog.Entry, seed: int):
    """The f32 model again, as `measure` first builds it."""
    ingress.seed_everything(seed)
    model = ingress.build_model(problem, entry.init_args, "f32")
    state.register_tensor_attributes(model)
    return model


def _floating(model) -> list:
    return [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]


def measure(entry: catalog.Entry, source: Path, dtype: str, seed: int) -> dict:
    """Eager f32, eager `dtype`, and eager f32 on the `dtype` values for one kernel; a record
    for the JSON Lines file."""
    import torch

    record: dict = {"kernel": entry.kernel, "dtype": dtype}
    phase = "load"
    errors = {"load": "f32-error", "f32": "f32-error", "eager": "cannot-run"}
    try:
        # kbd.worker.job._run up to the reference, in f32
        ingress.seed_everything(seed)
        problem = ingress.load_problem(str(source), source.read_text())
        model = ingress.build_model(problem, entry.init_args, "f32")
        if entry.inputs is None:
            args = [
                a.contiguous() if isinstance(a, torch.Tensor) else a for a in problem.get_inputs()
            ]
        else:
            args, _ = ingress.make_inputs(entry.inputs, seed)
        record["tensor_attributes"] = state.register_tensor_attributes(model)
        phase = "cast"
        tensors = [*model.parameters(), *model.buffers(), *args]
        if not any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors):
            record.update(status="cannot-run", phase=phase, error="nothing floating to cast")
            return record
        low_type = ingress.TORCH_DTYPES[dtype]
        # The same weights, cast: built again from the same seed (a deep copy would leave
        # closures such as `self.f = lambda x: self.mlp(x)` on the f32 modules), with plain
        # tensor attributes registered before the cast so that they are cast too.
        low_model = _rebuilt(problem, entry, seed).to(low_type)
        upcast_model = _rebuilt(problem, entry, seed).to(low_type).to(torch.float32)
        record["same_weights"] = all(
            torch.equal(w.to(low_type), c)
            for w, c in zip(_floating(model), _floating(low_model), strict=True)
        )
        low_args = [
            a.to(low_type) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args
        ]
        upcast_args = [
            a.to(torch.float32) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in low_args
        ]
        low_dtypes = _output_dtypes(low_model)
        rng = torch.get_rng_state()  # each forward starts from it, as kbd's compiled code does
        phase = "f32"
        with state.RecordRandom() as recorder:
            expected = ingress.reference(model, args)
        record["random_draws"] = len(recorder.draws)
        phase = "eager"
        torch.set_rng_state(rng)
        low = ingress.reference(low_model, low_args)
        phase = "upcast"
        torch.set_rng_state(rng)
        upcast = ingress.reference(upcast_model, upcast_args)
    except MemoryError as exc:
        record.update(status="memory", phase=phase, error=_first_line(exc))
        return record
    except Exception as exc:
        record.update(status=errors.get(phase, f"{phase}-error"), phase=phase)
        record["error"] = _first_line(exc)
        record["where"] = traceback.format_exc().strip().splitlines()[-3:-1]
        return record
    record["outputs"] = [
        {"shape": list(np.shape(o)), "f32": str(e.dtype), dtype: t}
        for e, o, t in zip(expected, low, low_dtypes, strict=False)
    ]
    mismatch = _outputs_ok(expected, low) or _outputs_ok(expected, upcast)
    if mismatch is not None:
        record.update(status="cannot-run", phase="compare", error=mismatch)
        return record
    record["status"] = "ok"
    record["integer_output"] = not all(np.issubdtype(o.dtype, np.floating) for o in expected)
    record["vs_f32"] = _figures(expected, low)
    record["vs_rounded"] = _figures(low, _rounded(expected, dtype))
    record["vs_upcast"] = _figures(low, _rounded(upcast, dtype))
    return record


def _child(conn, entry: catalog.Entry, source: Path, dtype: str, seed: int, mem: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if mem:
        resource.setrlimit(resource.RLIMIT_DATA, (mem, mem))
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        record = measure(entry, source, dtype, seed)
    except BaseException as exc:  # anything else is still data
        record = {"kernel": entry.kernel, "dtype": dtype, "status": "crash"}
        record["error"] = _first_line(exc)
    record["seconds"] = round(time.perf_counter() - start, 3)
    conn.send(record)
    conn.close()


# ---------------------------------------------------------------- the parent: schedule and report


def run_all(jobs, options, out) -> list[dict]:
    """Run every (entry, source, dtype) in its own forked process, `options.j` at a time."""
    context = multiprocessing.get_context("fork")  # the parent runs no torch op: fork is safe
    pending = list(jobs)
    running: dict = {}  # connection -> (process, job, deadline)
    records = []
    total = len(pending)
    while pending or running:
        while pending and len(running) < options.j:
            entry, source, dtype = job = pending.pop(0)
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_child,
                args=(send, entry, source, dtype, options.seed, options.mem_limit),
                daemon=True,
            )
            process.start()
            send.close()
            running[receive] = (process, job, time.monotonic() + options.timeout)
        soonest = min(deadline for _, _, deadline in running.values())
        ready = multiprocessing.connection.wait(
            list(running), timeout=max(0.0, soonest - time.monotonic())
        )
        now = time.monotonic()
        for conn in list(running):
            process, (entry, _, dtype), deadline = running[conn]
            record = None
            if conn in ready:
                try:
                    record = conn.recv()
                except EOFError:  # died without a word: a signal (segfault, OOM kill)
                    process.join()
                    code = process.exitcode
                    why = f"killed by {signal.Signals(-code).name}" if code and code < 0 else code
                    record = {"kernel": entry.kernel, "dtype": dtype, "status": "crash"}
                    record["error"] = f"worker died ({why})"
            elif now >= deadline:
                process.kill()
                record = {"kernel": entry.kernel, "dtype": dtype, "status": "timeout"}
                record["error"] = f"no result within {options.timeout:g} s"
            if record is None:
                continue
            process.join(5)
            conn.close()
            del running[conn]
            records.append(record)
            out.write(json.dumps(record) + "\n")
            out.flush()
            _progress(len(records), total, record)
    return records


def _progress(done: int, total: int, record: dict) -> None:
    if record["status"] == "ok":
        what = (
            f"vs f32 {record['vs_f32']['needed']:.3g}, "
            f"vs rounded {record['vs_rounded']['needed']:.3g}, "
            f"vs upcast {record['vs_upcast']['needed']:.3g}"
        )
    else:
        what = f"{record['status']}: {record.get('error', '')[:100]}"
    line = f"[{done}/{total}] {record['kernel']} {record['dtype']}: {what}"
    print(line, file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    """The smallest value that at least p% of the values are at most (a value of the data)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def passes(needed: float, tolerance: float) -> bool:
    return needed <= tolerance * (1 + 1e-12)  # as kbd.worker.check.compare


def report(records: list[dict], dtypes: list[str], kernels: int) -> None:
    for dtype in dtypes:
        mine = [r for r in records if r["dtype"] == dtype]
        ok = [r for r in mine if r["status"] == "ok"]
        print(f"\n== {dtype}: {len(ok)} of {kernels} kernels ran in {dtype} and in f32")
        differ = [r["kernel"] for r in ok if not r.get("same_weights", True)]
        if differ:
            print(f"rebuilt weights differ from the f32 model's (not seeded?): {', '.join(differ)}")
        if ok:
            cells = "".join(f"{'p' + str(p):>10}" for p in PERCENTILES)
            print(f"{'needed tolerance':<28}{cells}{'max':>10}")
            for key, label in FIGURES:
                values = [r[key]["needed"] for r in ok]
                cells = "".join(f"{percentile(values, p):>10.3g}" for p in PERCENTILES)
                print(f"{label:<28}{cells}{max(values):>10.3g}")
            print(f"{'kernels passing at t':<28}" + "".join(f"{t:>8g}" for t in CANDIDATES))
            for key, label in FIGURES:
                counts = [sum(passes(r[key]["needed"], t) for r in ok) for t in CANDIDATES]
                print(f"{label:<28}" + "".join(f"{c:>8d}" for c in counts))
                print(f"{'  (%)':<28}" + "".join(f"{100 * c / len(ok):>8.1f}" for c in counts))
            for key, label in FIGURES:
                worst = sorted(ok, key=lambda r, k=key: r[k]["needed"], reverse=True)[:10]
                print(f"largest needs, {label}:")
                for r in worst:
                    f = r[key]
                    notes = f" ({r['random_draws']} random draws)" if r.get("random_draws") else ""
                    notes += " (integer output)" if r.get("integer_output") else ""
                    print(
                        f"  {f['needed']:>9.3g}  abs {f['max_abs']:<9.3g} rel {f['max_rel']:<9.3g}"
                        f" {r['kernel']}{notes}"
                    )
        failed = [r for r in mine if r["status"] != "ok"]
        by_status: dict[str, list[dict]] = {}
        for r in failed:
            by_status.setdefault(r["status"], []).append(r)
        for status, rs in sorted(by_status.items()):
            print(f"{status} in {dtype}: {len(rs)}")
            for r in sorted(rs, key=lambda r: r["kernel"]):
                print(f"  {r['kernel']} [{r.get('phase', '-')}]: {r.get('error', '')[:140]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kernels", nargs="*", help="kernel prefixes, e.g. level1/ (default: all)")
    parser.add_argument(
        "--levels",
        action="append",
        default=[],
        help="levels file (repeatable; default levels/level1.yaml, level2.yaml, level3.yaml)",
    )
    parser.add_argument(
        "--dtype", action="append", choices=DTYPES, default=[], help="repeatable; default both"
    )
    parser.add_argument("-j", type=int, default=1, help="processes at once (default 1, at most 2)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds per kernel and dtype")
    parser.add_argument("--seed", type=int, default=0, help="as kbd's --seed (default 0)")
    parser.add_argument(
        "--mem-limit",
        type=float,
        default=4,
        help="GiB of RLIMIT_DATA per process, as kbd's --mem-limit (default 4; 0: none)",
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / ".kbd" / "dtype-tolerance.jsonl"),
        help="JSON Lines output, one record per kernel and dtype (default .kbd/...)",
    )
    options = parser.parse_args()
    if not 1 <= options.j <= 2:
        parser.error("-j must be 1 or 2")
    options.mem_limit = int(options.mem_limit * (1 << 30))
    dtypes = options.dtype or list(DTYPES)
    files = [Path(f) for f in options.levels] or [
        catalog.LEVELS_DIR / f"level{n}.yaml" for n in (1, 2, 3)
    ]
    root = catalog.kernelbench_root(None)
    entries = catalog.select(catalog.load(files), options.kernels)
    catalog.check_sources(entries, root)
    jobs = [(e, root / e.kernel, d) for e in entries for d in dtypes]
    out_path = Path(options.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"CPU: {cpu_model(LOW_PRECISION_FLAGS)}; {len(entries)} kernels, {', '.join(dtypes)}; "
        f"-j {options.j}, one thread each, nice {os.nice(0)}",
        flush=True,
    )
    start = time.monotonic()
    with out_path.open("w") as out:
        records = run_all(jobs, options, out)
    elapsed = time.monotonic() - start
    report(records, dtypes, len(entries))
    print(f"\n{len(jobs)} runs in {elapsed:.0f} s; records in {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
