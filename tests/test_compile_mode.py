"""Compile mode (torch.compile with kbd's Dynamo backend) and `--mode both`, on fixture kernels:
graph breaks, an eager-only forward, random ops and state written in forward, faults, and
`--benchmark` in both modes (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import FIXTURE_KB, ROOT, kbd

COMPILE_LEVELS = ROOT / "tests" / "fixtures" / "compile.yaml"

# kernel -> (import-mode outcome, compile-mode outcome)
EXPECTED = {
    "level7/1_graph_break": ("error", "pass"),  # torch.export cannot branch on data
    "level7/2_eager_only": ("pass", "eager"),
    "level7/3_random_in_forward": ("pass", "pass"),
    "level7/4_tensor_attribute": ("pass", "pass"),
    "level7/5_buffer_mutation": ("pass", "pass"),
    "level7/6_transformer_layer": ("pass", "pass"),  # compile mode: MHA fast path off
    "level7/7_backend_error": ("error", "error"),  # torch-mlir cannot lower the FFT
    "level9/1_mismatch": ("mismatch", "mismatch"),
    "level9/15_segfault_traced": ("crash", "crash"),
    "level9/16_llvm_abort_traced": ("crash", "crash"),
    "level9/17_hang_traced": ("timeout", "timeout"),
    "level9/18_memory_hog_traced": ("memory", "memory"),
}
# Faults that strike only when traced: kernel -> (phase in import mode, in compile mode, signal)
FAULTS = {
    "level9/1_mismatch": ("check", "check", None),
    "level9/15_segfault_traced": ("import", "compile", "SIGSEGV"),
    "level9/16_llvm_abort_traced": ("import", "compile", "SIGABRT"),
    "level9/17_hang_traced": ("import", "compile", None),
    "level9/18_memory_hog_traced": ("import", "compile", None),
}


HANG = "level9/17_hang_traced"


def _sweep(cwd, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kbd", "sweep", "--kernelbench", str(FIXTURE_KB),
         "--levels", str(COMPILE_LEVELS), "--mode", "both", "--json", "-j", "2",
         "--mem-limit", "2GiB", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """Every kernel in both modes. The hang runs in a sweep of its own, at the same time, with a
    10 s limit; the others get 30 s, long enough for compile mode on a loaded 2-core machine
    (and a limit the hang would hold a worker for, in each mode)."""
    cwd, hang_cwd = tmp_path_factory.mktemp("compile"), tmp_path_factory.mktemp("hang")
    others = [kernel.split("_")[0] + "_" for kernel in EXPECTED if kernel != HANG]
    sweeps = [_sweep(cwd, *others, "--timeout", "30"), _sweep(hang_cwd, HANG, "--timeout", "10")]
    results = []
    for sweep in sweeps:
        stdout, stderr = sweep.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(sweep.args, sweep.returncode, stdout, stderr))
    records = {}
    for result in results:
        for line in result.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                records[record["kernel"], record["mode"]] = record
    result, hang = results
    assert hang.returncode == 1, hang.stderr  # the hang times out
    return result, records, cwd


def test_every_kernel_runs_in_both_modes(both):
    result, records, _ = both
    assert set(records) == {(k, m) for k in EXPECTED for m in ("import", "compile")}, result.stderr
    assert result.returncode == 1


@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_outcome_per_mode(both, kernel):
    _, records, _ = both
    got = (records[kernel, "import"]["outcome"], records[kernel, "compile"]["outcome"])
    assert got == EXPECTED[kernel], (records[kernel, "import"], records[kernel, "compile"])


@pytest.mark.parametrize("kernel", sorted(FAULTS))
def test_faults_are_classified_alike_in_both_modes(both, kernel):
    """The same outcome, signal and message in both modes, in each mode's own phase (the
    fixtures fault while torch.export or Dynamo traces them, not in the shared eager reference)."""
    _, records, _ = both
    a, b = records[kernel, "import"], records[kernel, "compile"]
    import_phase, compile_phase, signal = FAULTS[kernel]
    assert (a["outcome"], a["signal"], a["message"]) == (b["outcome"], b["signal"], b["message"])
    assert (a["phase"], b["phase"], a["signal"]) == (import_phase, compile_phase, signal)


def test_graph_break_is_counted(both):
    _, records, _ = both
    coverage = records["level7/1_graph_break", "compile"]["coverage"]
    assert coverage["subgraphs"] == 2
    assert coverage["graph_breaks"] == 1
    assert "Data-dependent branching" in coverage["break_reasons"][0]
    assert coverage["eager_ops"]  # the branch condition is evaluated in eager
    assert records["level7/1_graph_break", "import"]["coverage"] is None


def test_failure_in_the_backend_keeps_coverage(both):
    """A kernel that fails compiling its second graph records the graph compiled before."""
    _, records, cwd = both
    record = records["level7/7_backend_error", "compile"]
    assert (record["phase"], record["message"]) == (
        "import",
        "TorchMlirCompilerError: Lowering Torch Backend IR -> Linalg-on-Tensors Backend IR "
        "failed with the following diagnostics:",
    )
    coverage = record["coverage"]
    assert (coverage["subgraphs"], coverage["graph_breaks"], coverage["finished"]) == (1, 1, False)
    assert "graph_break()" in coverage["break_reasons"][0]
    shown = kbd("results", cwd=cwd).stdout
    assert "1 graph (2 ops) compiled before the failure, 1 break" in shown
    assert " failed while compiling;" in shown  # this kernel and the memory hog
    assert "no result yet" not in shown  # both modes' records count as complete


def test_eager_only_forward_is_not_a_pass(both):
    _, records, _ = both
    record = records["level7/2_eager_only", "compile"]
    assert record["coverage"]["subgraphs"] == 0
    assert sum(record["coverage"]["eager_ops"].values()) >= 2  # relu and add ran in eager
    assert "nothing compiled" in record["message"]


def test_random_ops_take_eager_draws(both):
    _, records, _ = both
    for mode in ("import", "compile"):
        record = records["level7/3_random_in_forward", mode]
        assert record["random_inputs"] == 2
        assert record["max_abs_error"] < 1e-5  # the same numbers as eager, not just close


def test_state_writes_are_carried_out_and_reported(both):
    _, records, _ = both
    for mode in ("import", "compile"):
        assert records["level7/4_tensor_attribute", mode]["state_writes"] == ["hidden"]
        assert records["level7/5_buffer_mutation", mode]["state_writes"] == ["running"]
    full = records["level7/5_buffer_mutation", "compile"]["coverage"]
    assert (full["subgraphs"], full["eager_ops"]) == (1, {})


def test_both_modes_are_stored_and_shown(both):
    _, _, cwd = both
    shown = kbd("results", cwd=cwd)
    assert "level7/2_eager_only [compile]" in shown.stdout
    assert "compile coverage: " in shown.stdout
    stored = kbd("results", "--json", cwd=cwd)
    modes = [json.loads(line)["mode"] for line in stored.stdout.splitlines()]
    assert modes.count("import") == modes.count("compile") == len(EXPECTED) - 1  # not the hang
    side = next(line for line in shown.stdout.splitlines() if line.startswith("level7/2_eager"))
    assert "pass" in side and "eager" in side


def test_benchmark_in_both_modes(tmp_path):
    """Compile mode times the whole compiled forward from Python; both modes' figures are stored
    and shown side by side, in the fast_p table, the HTML page and `kbd compare`."""
    quick = ["--benchmark", "--bench-time", "0.02", "--bench-samples", "3"]
    quick += ["--bench-processes", "2"]  # not the default 3: still merges processes, in both modes
    selection = ["level7/1_", "level7/5_", "level9/1_", "--mode", "both", "-j", "2", *quick]
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(COMPILE_LEVELS), *selection]
    result = kbd("sweep", *args, "--timeout", "60", cwd=tmp_path)
    assert result.returncode == 1, result.stderr  # the mismatch fixture, the graph break import
    stored = kbd("results", "--json", cwd=tmp_path).stdout.splitlines()
    records = {(r["kernel"], r["mode"]): r for r in map(json.loads, stored)}
    for kernel in ("level7/1_graph_break", "level7/5_buffer_mutation"):
        record = records[kernel, "compile"]
        assert (record["outcome"], record["phase"]) == ("pass", "bench"), record["message"]
        bench = record["bench"]
        assert bench["loop"] == "python" and bench["samples"]["loop"] == "python"
        assert bench["compiled"]["n"] >= 3 and bench["eager"]["n"] >= 3
        assert bench["speedup"] > 0 and bench["overhead_ns"] > 0
        assert record["coverage"]["subgraphs"] >= 1
    # import mode times the state eager started from: a buffer-mutating forward still matches
    stateful = records["level7/5_buffer_mutation", "import"]
    assert (stateful["outcome"], stateful["bench"]["loop"]) == ("pass", "jit"), stateful["message"]
    graph_break = records["level7/1_graph_break", "import"]
    assert graph_break["not_benchmarked"].startswith("did not pass (error")
    for mode in ("import", "compile"):
        assert records["level9/1_mismatch", mode]["bench"] is None

    fast_p = {tuple(r[:2]): r[2:4] for r in map(str.split, result.stdout.splitlines()) if r}
    assert fast_p["level7", "compile"] == ["2", "2"]  # kernels, timed: per mode
    assert fast_p["level7", "import"] == ["2", "1"]
    assert fast_p["level9", "compile"] == fast_p["level9", "import"] == ["1", "0"]
    lines = result.stdout.splitlines()
    side = next(line for line in lines if line.startswith("level7/5_buffer_mutation "))
    assert side.count("x [") == 2  # a speedup with its interval in each mode's column

    page = tmp_path / "r.html"
    assert kbd("results", "--html", str(page), cwd=tmp_path).returncode == 0
    data = page.read_text().split('id="kbd-data">')[1].split("</script>")[0]
    timed = {(k["kernel"], k["mode"]) for k in json.loads(data)["kernels"] if "speedup" in k}
    assert timed == {
        ("level7/1_graph_break", "compile"),
        ("level7/5_buffer_mutation", "compile"),
        ("level7/5_buffer_mutation", "import"),
    }
    compared = kbd("compare", "1", "1", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in compared.stdout.splitlines()]
    assert len(rows) == 6 and "level7/5_buffer_mutation [compile]" in {r["kernel"] for r in rows}
    assert {r["verdict"] for r in rows} <= {"same", "failing"}
