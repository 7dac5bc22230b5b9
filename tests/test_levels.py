"""The levels tools: knobs, the worker-side measurement, file assembly, `kbd levels ...`."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from kbd import cli
from kbd.levels import generate
from kbd.plan import catalog, schema
from kbd.shared.protocol import Generate, Generated, Limits
from kbd.worker import knobs
from tests.conftest import kbd

SMOKE = schema.TIERS["smoke"]
HEADER = "import torch\nimport torch.nn as nn\n\n"

PROBLEMS = {
    "level1/1_Large_K_matmul.py": """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, A, B):
                return torch.matmul(A, B)

        M = 1024
        N = 512
        K = 65536 * 2

        def get_inputs():
            return [torch.rand(M, K), torch.rand(K, N)]

        def get_init_inputs():
            return []
        """,
    "level1/2_CrossEntropy.py": """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, predictions, targets):
                return torch.nn.functional.cross_entropy(predictions, targets)

        batch_size = 256
        num_classes = 100
        input_shape = (num_classes,)
        dim = 1

        def get_inputs():
            return [torch.rand(batch_size, *input_shape),
                    torch.randint(0, num_classes, (batch_size,))]

        def get_init_inputs():
            return []
        """,
    "level1/3_Small_scale.py": """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, A, s):
                return torch.relu(A) * s

        batch_size = 16
        dim = 64

        def get_inputs():
            return [torch.randn(batch_size, dim), 3.5]

        def get_init_inputs():
            return []
        """,
    "level2/1_Conv2d_grouped_ReLU.py": """
        class Model(nn.Module):
            def __init__(self, in_channels, out_channels, kernel_size, groups):
                super().__init__()
                self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, groups=groups)

            def forward(self, x):
                return torch.relu(self.conv(x))

        batch_size = 64
        in_channels = 64
        out_channels = 128
        kernel_size = 3
        groups = 4
        height = width = 256

        def get_inputs():
            return [torch.rand(batch_size, in_channels, height, width)]

        def get_init_inputs():
            return [in_channels, out_channels, kernel_size, groups]
        """,
    "level3/1_Masked_triu.py": """
        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, A, mask):
                return torch.triu(A) * mask, A.sum()

        N = 64

        def get_inputs():
            A = torch.triu(torch.rand(N, N))
            return [A, torch.randint(0, 2, (N, N)).bool()]

        def get_init_inputs():
            return []
        """,
    "level3/2_Reads_module_constant.py": """
        class Model(nn.Module):
            def __init__(self, hidden_size):
                super().__init__()
                self.state = torch.zeros(batch_size, hidden_size)  # reads the module constant

            def forward(self, x):
                return x + self.state

        batch_size = 2048
        hidden_size = 16384

        def get_inputs():
            return [torch.rand(batch_size, hidden_size)]

        def get_init_inputs():
            return [hidden_size]
        """,
}


HANG = """
class Model(nn.Module):
    def forward(self, x):
        return x

while True:
    pass

def get_inputs():
    return [torch.rand(4)]

def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kb") / "KernelBench"
    for rel, body in PROBLEMS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER + textwrap.dedent(body))
    return root


def measure(kb: Path, kernel: str, **given) -> Generated:
    """The worker side, in this process: what a worker answers to a Generate task."""
    from kbd.worker import generate as worker

    path = kb / kernel
    task = Generate(kernel, str(path), path.read_text(), SMOKE.budget, Limits(), **given)
    return worker.run(task, lambda phase: None)


def _dims(shape: str) -> list[int]:
    return [int(t) for t in shape.split("x") if t.isdigit()]


# --- the worker side --------------------------------------------------------------------------


def test_huge_matmul_reduced_within_budget_keeping_k_largest(kb: Path):
    g = measure(kb, "level1/1_Large_K_matmul.py")
    (m, k), (k2, n) = (_dims(s) for s in g.input_shapes)
    assert k == k2
    assert k > 16 * m and k > 16 * n  # still a "large K" matmul, ratios kept
    assert m == 2 * n
    assert g.fits and g.nbytes == 4 * (m * k + k * n + m * n) <= SMOKE.budget.nbytes
    assert g.flops == 2 * m * n * k <= SMOKE.budget.flops
    assert g.original_flops == 2 * 1024 * 512 * 65536 * 2
    assert g.outputs == [(m, n)]
    assert g.init_args == []
    assert ("K", 131072, k) in g.reductions
    assert g.fields == {"family": "matmul"}  # from the exported graph at the chosen shapes


def test_integer_targets_get_i64_and_class_range(kb: Path):
    g = measure(kb, "level1/2_CrossEntropy.py")
    assert g.input_shapes == ["256x100", "256xi64"]  # within budget: shapes kept
    assert g.initializations == ["rnd", "rnd100"]
    assert g.outputs == [()]
    assert g.reductions == []
    assert g.fields == {"family": "reduction"}  # cross_entropy_loss: a loss, a reduction


def test_scalar_input_randn_and_fallback_flops(kb: Path):
    g = measure(kb, "level1/3_Small_scale.py")
    assert g.input_shapes == ["16x64", 3.5]
    assert g.initializations == ["randn", "scalar"]
    assert g.flops > 0  # FlopCounterMode counts 0 here: the element estimate is used
    assert g.fields == {"family": "element_wise"}


def test_conv_reduced_keeps_kernel_and_groups(kb: Path):
    g = measure(kb, "level2/1_Conv2d_grouped_ReLU.py")
    in_ch, out_ch, kernel_size, groups = g.init_args
    assert (kernel_size, groups) == (3, 4)
    assert in_ch % groups == 0 and out_ch % groups == 0
    (x,) = (_dims(s) for s in g.input_shapes)
    assert x[1] == in_ch and x[2] == x[3] < 256  # square stays square
    assert g.flops <= SMOKE.budget.flops
    assert g.fields == {"family": "conv2d"}


def test_triu_mask_and_several_outputs(kb: Path):
    g = measure(kb, "level3/1_Masked_triu.py")
    assert g.input_shapes == ["64x64", "64x64xi1"]
    assert g.initializations == ["triu", "rnd"]
    assert g.outputs == [(64, 64), ()]


def test_model_reading_a_module_constant_keeps_it(kb: Path):
    # kbd imports the unmodified file: batch_size stays 2048, so the hidden size is reduced.
    g = measure(kb, "level3/2_Reads_module_constant.py")
    (x,) = g.input_shapes
    assert _dims(x)[0] == 2048 and _dims(x)[1] < 16384
    assert g.init_args == [_dims(x)[1]]


def test_override_shapes_are_measured(kb: Path):
    g = measure(kb, "level1/1_Large_K_matmul.py", input_shapes=["8x4096", "4096x4"])
    assert g.input_shapes == ["8x4096", "4096x4"]
    assert g.outputs == [(8, 4)]
    assert g.flops == 2 * 8 * 4096 * 4


def test_override_init_args_are_measured(kb: Path):
    g = measure(kb, "level2/1_Conv2d_grouped_ReLU.py", init_args=[64, 32, 3, 4])
    assert g.init_args == [64, 32, 3, 4]
    assert g.outputs[0][1] == 32


def test_halve_keeps_odd_and_floor():
    assert knobs.halve(8205, 16) == 4103
    assert knobs.halve(4096, 16) == 2048
    assert knobs.halve(20, 16) == 16
    assert knobs.halve(3, 16) == 3  # never below min(original, floor), never above original
    assert math.prod(knobs.halve_knob((64, 64), (64, 64), 8)) == 32 * 32


# --- assembling files -------------------------------------------------------------------------

MEASURED = Generated(
    input_shapes=["8x16"],
    initializations=["rnd"],
    outputs=[(8, 16)],
    init_args=[16],
    flops=2048,
    nbytes=1024,
    original_flops=2048,
    original_nbytes=1024,
)


def assemble(path: Path, override: dict, result: Generated = MEASURED) -> str:
    kernel = "level1/1_K.py"
    measured = {kernel: generate.Measured(kernel, result)}
    return generate.assemble(SMOKE, "level1", [kernel], measured, {kernel: override}, path)


def test_regeneration_keeps_hand_set_fields_and_comments(tmp_path: Path):
    path = tmp_path / "level1.yaml"
    path.write_text(assemble(path, {}))
    text = path.read_text().replace(
        "  gflops: 2.048e-06\n",
        "  gflops: 2.048e-06\n  pipeline: matmul\n  dtype: f64\n"
        "  warning: 'error: Dialect `tm_tensor'' not found for op ''tm_tensor.scan'''\n"
        "  xfail: {outcome: crash, phase: jit}\n",
    )
    path.write_text(text)
    assert assemble(path, {}) == text  # byte-identical, every hand-set field kept
    (entry,) = catalog.load_file(path)
    assert (entry.pipeline, entry.dtype, str(entry.xfail)) == ("matmul", "f64", "crash / jit")
    assert entry.warning == "error: Dialect `tm_tensor' not found for op 'tm_tensor.scan'"


def test_regeneration_keeps_a_warning_written_as_lighthouse_writes_it(tmp_path: Path):
    """A `warning` in double quotes after `gflops` (lighthouse's form) is kept, in the
    generator's layout and quoting, which `kbd levels check` then finds the file in."""
    path = tmp_path / "level1.yaml"
    path.write_text(assemble(path, {}))
    path.write_text(
        path.read_text().replace(
            "  gflops: 2.048e-06\n",
            '  gflops: 2.048e-06\n  warning: "LLVM ERROR: SmallVector unable to grow"\n',
        )
    )
    text = assemble(path, {})
    assert "  gflops: 2.048e-06\n  warning: 'LLVM ERROR: SmallVector unable to grow'\n" in text
    path.write_text(text)
    assert assemble(path, {}) == text
    assert catalog.load_file(path)[0].warning == "LLVM ERROR: SmallVector unable to grow"
    assert schema.dump(SMOKE.header("level1"), *schema.parse(text)) == text  # check's layout


def test_overrides_replace_fields_and_reason_becomes_a_comment(tmp_path: Path):
    path = tmp_path / "level1.yaml"
    text = assemble(path, {"gflops": 0.123456789, "reason": "why these inputs"})
    assert "# why these inputs\n- kernel: level1/1_K.py\n" in text
    assert "  gflops: 0.123457\n" in text
    path.write_text(text)
    assert schema.parse(text)[1] == {"level1/1_K.py": ["why these inputs"]}


def test_over_budget_is_marked(tmp_path: Path):
    big = Generated(**{**{f: getattr(MEASURED, f) for f in MEASURED.__struct_fields__},
                       "fits": False})  # fmt: skip
    text = assemble(tmp_path / "level1.yaml", {}, big)
    assert "# over the smoke budget: 1.0 KiB, 2.048e-06 GFLOP\n- kernel:" in text


def test_extra_measured_fields_do_not_beat_hand_set_ones(tmp_path: Path):
    classified = Generated(**{**{f: getattr(MEASURED, f) for f in MEASURED.__struct_fields__},
                              "fields": {"pipeline": "conv"}})  # fmt: skip
    assert generate.entry("k.py", classified, {}, {})["pipeline"] == "conv"
    assert generate.entry("k.py", classified, {}, {"pipeline": "mine"})["pipeline"] == "mine"


def test_family_is_generated_anew_and_a_hand_set_pipeline_is_kept(tmp_path: Path):
    def measured(family: str) -> Generated:
        fields = {f: getattr(MEASURED, f) for f in MEASURED.__struct_fields__}
        return Generated(**{**fields, "fields": {"family": family}})

    path = tmp_path / "level1.yaml"
    path.write_text(assemble(path, {}, measured("matmul")))
    assert "  gflops: 2.048e-06\n  family: matmul\n" in path.read_text()
    path.write_text(
        path.read_text().replace("family: matmul\n", "family: matmul\n  pipeline: mine\n")
    )
    text = assemble(path, {}, measured("conv2d"))
    assert "  family: conv2d\n  pipeline: mine\n" in text  # measured again; hand-set kept
    path.write_text(text)
    (entry,) = catalog.load_file(path)
    assert (entry.family, entry.pipeline, entry.schedule_family) == ("conv2d", "mine", "mine")
    assert "  family:" not in assemble(path, {}, MEASURED)  # no family found: none written


def test_bad_overrides_are_input_errors(tmp_path: Path):
    path = tmp_path / "overrides.yaml"
    path.write_text("level1/1_K.py: {warning: x}\n")
    with pytest.raises(catalog.InputError, match="unknown field 'warning'"):
        generate.load_overrides(path)


# --- the commands -----------------------------------------------------------------------------


def test_generate_runs_each_problem_in_a_sandboxed_worker(kb: Path, tmp_path: Path):
    """One worker per problem: a problem that never ends times out alone and keeps its entry."""
    hang = kb.parent / "hang" / "level1"
    hang.mkdir(parents=True)
    for rel in ("level1/2_CrossEntropy.py", "level1/3_Small_scale.py"):
        (hang / Path(rel).name).write_text((kb / rel).read_text())
    (hang / "9_hang.py").write_text(HEADER + HANG)
    levels = tmp_path / "levels"
    args = ("levels", "generate", "--kernelbench", str(hang.parent), "--levels-dir", str(levels))
    # 3 s: the hanging problem never ends, the real ones load in well under a second, but not
    # always within 1 s on a loaded machine
    result = kbd(*args, "--timeout", "3", "--log-dir", str(tmp_path / "logs"), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "level1/9_hang.py: timeout in load" in result.stderr
    entries = {e.kernel: e for e in catalog.load_file(levels / "level1.yaml")}
    assert sorted(entries) == ["level1/2_CrossEntropy.py", "level1/3_Small_scale.py"]


def test_update_files_writes_only_changes_and_check_writes_nothing(tmp_path: Path):
    same, new = tmp_path / "level1.yaml", tmp_path / "sub" / "level2.yaml"
    text = "- kernel: level1/1_K.py\n"
    same.write_text(text)
    texts = {same: text, new: "- kernel: level2/1_K.py\n"}
    assert generate.update_files(texts, check=True) == [new] and not new.exists()
    assert generate.update_files(texts, check=False) == [new] and new.read_text() == texts[new]
    assert generate.update_files(texts, check=True) == []
    with pytest.raises(catalog.InputError, match="unknown field 'colour'"):
        generate.update_files({same: "- kernel: level1/1_K.py\n  colour: red\n"}, check=False)
    assert same.read_text() == text  # refused by the catalog: not written


def test_check_passes_on_the_repository(capsys):
    assert cli.main(["levels", "check"]) == 0
    out = capsys.readouterr().out
    assert "level1.yaml: 100 entries" in out and out.endswith("ok\n")


def test_check_without_kernelbench_skips_that_part(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KBD_KERNELBENCH", str(tmp_path / "nowhere"))
    assert cli.main(["levels", "check"]) == 0
    assert "skipped checking the kernels against KernelBench" in capsys.readouterr().out


def test_check_reports_layout_and_schema_problems(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("KBD_KERNELBENCH", str(tmp_path / "no"))  # not checked against one
    levels = tmp_path / "levels"
    levels.mkdir()
    (levels / "level1.yaml").write_text(
        SMOKE.header("level1") + "\n- kernel: level1/1_K.py\n  gflops:   1\n"
    )
    (levels / "level2.yaml").write_text("- kernel: level2/1_K.py\n  colour: red\n")
    assert cli.main(["levels", "check", "--levels-dir", str(levels)]) == 1
    out = capsys.readouterr().out
    line = SMOKE.header("level1").count("\n") + 3  # after the header, a blank line, the kernel
    assert f"level1.yaml:{line}: not in the generator's layout (expected '  gflops: 1')" in out
    assert "level2/1_K.py: unknown field 'colour'" in out
