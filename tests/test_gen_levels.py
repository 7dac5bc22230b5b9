"""Tests for scripts/gen-levels on small KernelBench-style fixture problems."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gen-levels"


def _load_script():
    name = "gen_levels_under_test"
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(SCRIPT))
    spec = importlib.util.spec_from_loader(name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


gen = _load_script()

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


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kb") / "KernelBench"
    for rel, body in PROBLEMS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(HEADER + textwrap.dedent(body))
    return root


def _run(kb: Path, levels: Path, *extra: str) -> int:
    return gen.main(["--kernelbench", str(kb), "--levels-dir", str(levels), *extra])


def _entries(levels: Path, level: str) -> dict[str, dict]:
    data = yaml.safe_load((levels / f"{level}.yaml").read_text())
    return {e["kernel"]: e for e in data}


def _dims(shape: str) -> list[int]:
    return [int(t) for t in shape.split("x") if t.isdigit()]


@pytest.fixture(scope="module")
def generated_once(kb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    levels = tmp_path_factory.mktemp("generated") / "levels"
    assert _run(kb, levels) == 0
    return levels


@pytest.fixture
def generated(generated_once: Path, tmp_path: Path) -> Path:
    """A private copy of the levels files generated once for this module."""
    levels = tmp_path / "levels"
    shutil.copytree(generated_once, levels)
    return levels


def test_every_problem_gets_an_entry(generated: Path):
    for level, count in (("level1", 3), ("level2", 1), ("level3", 2)):
        entries = _entries(generated, level)
        assert len(entries) == count
        for entry in entries.values():
            assert list(entry)[:4] == [
                "kernel",
                "input_shapes",
                "initializations",
                "output_shape",
            ]
            assert entry["gflops"] > 0
            assert len(entry["input_shapes"]) == len(entry["initializations"])
    assert (generated / "level1.yaml").read_text().startswith("# level1 smoke shapes")


def test_huge_matmul_reduced_within_budget_keeping_k_largest(generated: Path):
    entry = _entries(generated, "level1")["level1/1_Large_K_matmul.py"]
    (m, k), (k2, n) = (_dims(s) for s in entry["input_shapes"])
    assert k == k2
    assert k > 16 * m and k > 16 * n  # still a "large K" matmul, ratios kept
    assert m == 2 * n
    nbytes = 4 * (m * k + k * n + m * n)
    assert nbytes <= gen.BYTE_BUDGET
    assert entry["gflops"] == pytest.approx(2 * m * n * k / 1e9, rel=1e-5)
    assert entry["gflops"] * 1e9 <= gen.FLOP_BUDGET
    assert entry["output_shape"] == f"{m}x{n}"
    assert "init_args" not in entry


def test_integer_targets_get_i64_and_class_range(generated: Path):
    entry = _entries(generated, "level1")["level1/2_CrossEntropy.py"]
    assert entry["input_shapes"] == ["256x100", "256xi64"]  # within budget: shapes kept
    assert entry["initializations"] == ["rnd", "rnd100"]
    assert entry["output_shape"] == "scalar"


def test_scalar_input_randn_and_fallback_flops(generated: Path):
    entry = _entries(generated, "level1")["level1/3_Small_scale.py"]
    assert entry["input_shapes"] == ["16x64", 3.5]
    assert entry["initializations"] == ["randn", "scalar"]
    assert entry["output_shape"] == "16x64"
    assert entry["gflops"] > 0  # FlopCounterMode counts 0 here: the estimate is used


def test_conv_reduced_keeps_kernel_and_groups(generated: Path):
    entry = _entries(generated, "level2")["level2/1_Conv2d_grouped_ReLU.py"]
    in_ch, out_ch, kernel_size, groups = entry["init_args"]
    assert (kernel_size, groups) == (3, 4)
    assert in_ch % groups == 0 and out_ch % groups == 0
    (x,) = (_dims(s) for s in entry["input_shapes"])
    assert x[1] == in_ch and x[2] == x[3]  # square stays square
    assert x[2] < 256
    assert entry["gflops"] * 1e9 <= gen.FLOP_BUDGET


def test_triu_mask_and_several_outputs(generated: Path):
    entry = _entries(generated, "level3")["level3/1_Masked_triu.py"]
    assert entry["input_shapes"] == ["64x64", "64x64xi1"]
    assert entry["initializations"] == ["triu", "rnd"]
    assert entry["output_shape"] == ["64x64", "scalar"]


def test_model_reading_a_module_constant_keeps_it(generated: Path):
    # kbd imports the unmodified file: batch_size stays 2048, so the hidden size is reduced.
    entry = _entries(generated, "level3")["level3/2_Reads_module_constant.py"]
    (x,) = entry["input_shapes"]
    assert _dims(x)[0] == 2048 and _dims(x)[1] < 16384
    assert entry["init_args"] == [_dims(x)[1]]


def test_regeneration_is_byte_identical_and_check(kb: Path, generated: Path):
    before = {p.name: p.read_bytes() for p in generated.glob("level*.yaml")}
    assert _run(kb, generated, "--check") == 0
    assert _run(kb, generated) == 0
    assert {p.name: p.read_bytes() for p in generated.glob("level*.yaml")} == before
    path = generated / "level2.yaml"
    path.write_text(path.read_text().replace("gflops:", "gflops: 1 #"))
    assert _run(kb, generated, "--check") == 1
    assert path.read_text() != before["level2.yaml"].decode()  # --check writes nothing


def test_overrides_and_kept_keys(kb: Path, generated: Path):
    level1 = generated / "level1.yaml"
    data = yaml.safe_load(level1.read_text())
    for entry in data:
        if entry["kernel"] == "level1/2_CrossEntropy.py":
            entry["xfail"] = {"outcome": "error", "phase": "import", "message": "boom"}
            entry["pipeline"] = "element_wise"
    level1.write_text(yaml.safe_dump(data, sort_keys=False))
    overrides = {
        "level1/1_Large_K_matmul.py": {
            "input_shapes": ["8x4096", "4096x4"],
            "gflops": 0.123456789,
            "warning": "hand-written",
        }
    }
    (generated / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    assert _run(kb, generated) == 0
    entries = _entries(generated, "level1")
    matmul = entries["level1/1_Large_K_matmul.py"]
    assert matmul["input_shapes"] == ["8x4096", "4096x4"]
    assert matmul["output_shape"] == "8x4"  # measured at the overridden shapes
    assert matmul["gflops"] == 0.123457
    assert matmul["warning"] == "hand-written"
    ce = entries["level1/2_CrossEntropy.py"]
    assert ce["xfail"] == {"outcome": "error", "phase": "import", "message": "boom"}
    assert ce["pipeline"] == "element_wise"
    assert list(ce)[-2:] == ["pipeline", "xfail"]
    text = level1.read_text()
    assert _run(kb, generated) == 0
    assert level1.read_text() == text


def test_init_args_override_measures_output(kb: Path, generated: Path):
    conv = "level2/1_Conv2d_grouped_ReLU.py"
    in_ch, _out, k, groups = _entries(generated, "level2")[conv]["init_args"]
    overrides = {conv: {"init_args": [in_ch, 32, k, groups]}}
    (generated / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    assert _run(kb, generated) == 0
    entry = _entries(generated, "level2")[conv]
    assert entry["init_args"] == [in_ch, 32, k, groups]
    assert _dims(entry["output_shape"])[1] == 32


def test_only_regenerates_selected(kb: Path, generated: Path):
    level1 = generated / "level1.yaml"
    text = level1.read_text().replace("output_shape: 16x64", "output_shape: 1x1")
    level1.write_text(text)
    assert _run(kb, generated, "--only", "level1/2_") == 0
    assert "output_shape: 1x1" in level1.read_text()  # not selected: kept as it was
    assert _run(kb, generated, "--only", "level1/3_") == 0
    assert "output_shape: 16x64" in level1.read_text()


def test_missing_kernelbench_exits_2(tmp_path: Path, capsys):
    assert _run(tmp_path / "nowhere", tmp_path / "levels") == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "KernelBench not found" in out


def test_halve_keeps_odd_and_floor():
    assert gen.halve(8205, 16) == 4103
    assert gen.halve(4096, 16) == 2048
    assert gen.halve(20, 16) == 16
    assert gen.halve(3, 16) == 3  # never below min(original, floor), never above original
    assert math.prod(gen.halve_knob((64, 64), (64, 64), 8)) == 32 * 32
