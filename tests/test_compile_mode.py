"""Compile mode (torch.compile with kbd's Dynamo backend) and `--mode both`, on fixture kernels:
graph breaks, an eager-only forward, random ops and state written in forward, and faults."""

from __future__ import annotations

import json

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
    "level9/1_mismatch": ("mismatch", "mismatch"),
    "level9/3_segfault": ("crash", "crash"),
    "level9/4_llvm_abort": ("crash", "crash"),
    "level9/6_hang": ("timeout", "timeout"),
    "level9/8_memory_hog": ("memory", "memory"),
}


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("compile")
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(COMPILE_LEVELS), "--mode", "both"]
    # 30 s: long enough for compile mode on a loaded 2-core machine; the hang fixture waits it out
    result = kbd(
        "sweep", *args, "--json", "-j", "2", "--timeout", "30", "--mem-limit", "2GiB", cwd=cwd
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    records = {(r["kernel"], r["mode"]): r for r in lines}
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


def test_faults_are_classified_alike_in_both_modes(both):
    _, records, _ = both
    for kernel in EXPECTED:
        if kernel.startswith("level9/"):
            a, b = records[kernel, "import"], records[kernel, "compile"]
            assert (a["outcome"], a["phase"], a["signal"]) == (
                b["outcome"],
                b["phase"],
                b["signal"],
            )


def test_graph_break_is_counted(both):
    _, records, _ = both
    coverage = records["level7/1_graph_break", "compile"]["coverage"]
    assert coverage["subgraphs"] == 2
    assert coverage["graph_breaks"] == 1
    assert "Data-dependent branching" in coverage["break_reasons"][0]
    assert coverage["eager_ops"]  # the branch condition is evaluated in eager
    assert records["level7/1_graph_break", "import"]["coverage"] is None


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
    assert modes.count("import") == modes.count("compile") == len(EXPECTED)
    side = next(line for line in shown.stdout.splitlines() if line.startswith("level7/2_eager"))
    assert "pass" in side and "eager" in side
