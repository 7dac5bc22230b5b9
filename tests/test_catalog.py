"""Levels files: valid entries, every validation error, selection and KernelBench lookup."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import yaml

from kbd.plan import catalog
from kbd.plan.catalog import Entry, Expectation, check_sources, kernelbench_root, load, load_file
from kbd.shared.errors import InputError
from kbd.shared.protocol import Scalar, Tensor
from kbd.shared.shapes import Shape

KERNEL = "level1/5_Matrix_scalar_multiplication.py"


def write(tmp_path: Path, text: str, name: str = "levels.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def entry(tmp_path: Path, text: str) -> Entry:
    (result,) = load_file(write(tmp_path, text))
    return result


def error(tmp_path: Path, text: str, name: str = "levels.yaml") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(InputError) as info:
        load([path])
    message = str(info.value)
    assert str(path) in message
    assert "\n" not in message
    return message


# --- valid entries ---------------------------------------------------------------------------


def test_full_entry(tmp_path):
    e = entry(
        tmp_path,
        f"""
        - kernel: {KERNEL}
          input_shapes: [64x512, 3.14]
          initializations: [rnd, scalar]
          output_shape: 64x512
          gflops: (64 * 512) / 1e9
          pipeline: my-pipeline
        """,
    )
    assert e.kernel == KERNEL
    assert e.name == KERNEL.removesuffix(".py")
    assert e.levels_file == str(tmp_path / "levels.yaml")
    assert e.inputs == [Tensor(Shape((64, 512), "f32", "rnd")), Scalar(3.14)]
    assert e.outputs == [Shape((64, 512), "f32")]
    assert e.gflops == pytest.approx(64 * 512 / 1e9)
    assert e.pipeline == "my-pipeline"
    assert e.dtype == "f32"
    assert e.init_args is None
    assert e.xfail is None


def test_minimal_entry(tmp_path):
    e = entry(tmp_path, "- kernel: level2/1_Conv.py\n")
    assert e.inputs is None
    assert e.outputs is None
    assert e.gflops is None
    assert e.pipeline is None
    assert e.dtype == "f32"


def test_integer_scalar_and_integer_dimension(tmp_path):
    e = entry(
        tmp_path,
        """
        - kernel: level1/1_K.py
          input_shapes: [128, 3]
          initializations: [randn, scalar]
        """,
    )
    assert e.inputs == [Tensor(Shape((128,), "f32", "randn")), Scalar(3)]
    assert isinstance(e.inputs[1].value, int)


def test_entry_dtype_is_the_default_for_inputs_and_outputs(tmp_path):
    e = entry(
        tmp_path,
        """
        - kernel: level1/1_K.py
          dtype: f16
          input_shapes: [4x4, 4x4xi64]
          initializations: [rnd, rnd9]
          output_shape: [4x4, scalar]
        """,
    )
    assert e.dtype == "f16"
    assert e.inputs == [Tensor(Shape((4, 4), "f16", "rnd")), Tensor(Shape((4, 4), "i64", "rnd9"))]
    assert e.outputs == [Shape((4, 4), "f16"), Shape((), "f16")]


def test_scalar_output(tmp_path):
    e = entry(tmp_path, "- kernel: level1/1_K.py\n  output_shape: scalar\n")
    assert e.outputs == [Shape((), "f32")]


def test_list_output_shape(tmp_path):
    e = entry(tmp_path, "- kernel: level1/1_K.py\n  output_shape: [64x256, 64, scalar]\n")
    assert e.outputs == [Shape((64, 256), "f32"), Shape((64,), "f32"), Shape((), "f32")]


def test_init_args_yaml_list(tmp_path):
    e = entry(tmp_path, "- kernel: level3/1_MLP.py\n  init_args: [128, [128], 128]\n")
    assert e.init_args == [128, [128], 128]


def test_init_args_string(tmp_path):
    e = entry(tmp_path, "- kernel: level3/1_MLP.py\n  init_args: (128,[128],128)\n")
    assert e.init_args == [128, [128], 128]


def test_init_args_quoted_string_and_single_value(tmp_path):
    (a, b, c) = load_file(
        write(
            tmp_path,
            """
            - kernel: level1/1_A.py
              init_args: "[1, 2.5, 'x']"
            - kernel: level1/2_B.py
              init_args: 7
            - kernel: level1/3_C.py
              init_args: None
            """,
        )
    )
    assert a.init_args == [1, 2.5, "x"]
    assert b.init_args == [7]
    assert c.init_args is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("(2*3)/1e9", 6e-9), ('"2 ** 10 - 24"', 1000.0), ("12", 12.0), ("0.5", 0.5)],
)
def test_gflops(tmp_path, value, expected):
    e = entry(tmp_path, f"- kernel: level1/1_K.py\n  gflops: {value}\n")
    assert isinstance(e.gflops, float)
    assert e.gflops == pytest.approx(expected)


def test_xfail_mapping(tmp_path):
    e = entry(
        tmp_path,
        """
        - kernel: level1/1_K.py
          xfail:
            outcome: crash
            phase: pipeline:convert-linalg-to-loops
            message: "LLVM ERROR: cannot"
        """,
    )
    assert e.xfail == Expectation("crash", "pipeline:convert-linalg-to-loops", "LLVM ERROR: cannot")
    assert str(e.xfail) == "crash / pipeline:convert-linalg-to-loops / LLVM ERROR: cannot"


def test_xfail_outcome_only(tmp_path):
    e = entry(tmp_path, "- kernel: level1/1_K.py\n  xfail: {outcome: timeout}\n")
    assert e.xfail == Expectation("timeout")
    assert str(e.xfail) == "timeout"


def test_empty_file_has_no_entries(tmp_path):
    assert load_file(write(tmp_path, "# nothing yet\n")) == []


def test_load_several_files_in_order(tmp_path):
    a = write(tmp_path, "- kernel: level1/1_A.py\n- kernel: level1/2_B.py\n", "a.yaml")
    b = write(tmp_path, "- kernel: level2/1_C.py\n", "b.yaml")
    entries = load([a, b])
    assert [e.kernel for e in entries] == ["level1/1_A.py", "level1/2_B.py", "level2/1_C.py"]
    assert [e.levels_file for e in entries] == [str(a), str(a), str(b)]


def test_warning(tmp_path):
    a, b, c = load_file(
        write(
            tmp_path,
            """
            - kernel: level1/1_A.py
              warning: "error: Dialect `tm_tensor' not found for custom op 'tm_tensor.scan'"
            - kernel: level1/2_B.py
              warning: ""
            - kernel: level1/3_C.py
            """,
        )
    )
    assert a.warning == "error: Dialect `tm_tensor' not found for custom op 'tm_tensor.scan'"
    assert b.warning is None  # shows nothing, as in lighthouse
    assert c.warning is None


def test_lighthouse_forms(tmp_path):
    """Every field and value form of lighthouse's examples/KernelBench/level*.yaml and ci.yaml,
    read as its test-kernel-bench.py means them (a fixture of the same form, not its files)."""
    lhs = load_file(
        write(
            tmp_path,
            """
            - kernel: level1/1_Square_matrix_multiplication_.py
              input_shapes: [1024x1024, 1024x1024]
              initializations: [rnd, id]
              output_shape: 1024x1024
              gflops: (1024 * 1024 * 1024 * 2) / 1e9
              pipeline: matmul

            - kernel: level1/5_Matrix_scalar_multiplication.py
              input_shapes: [64x512, "1"]
              initializations: [rnd, rnd]
              output_shape: 64x512
              gflops: (64 * 512) / 1e9
              pipeline: element_wise

            - kernel: level1/95_CrossEntropyLoss.py
              input_shapes: [32768x4096, 32768]
              initializations: [rnd, rnd]
              output_shape: "1"
              gflops: (32768 * 4096) / 1e9
              warning: "RuntimeError: gather(): Expected dtype int32/int64 for index"

            - kernel: level2/23_Conv3d_GroupNorm_Mean.py
              input_shapes: [128x3x24x32x32]
              initializations: [rnd]
              output_shape: 128

            - kernel: level3/1_MLP.py
              input_shapes: [64x128]
              initializations: [rnd]
              output_shape: 64x128
              init_args: (128,[128],128)
              gflops: (2 * (64 * 128 * 128) + (64 * 128 * 128) + (64 * 128)) / 1e9
              pipeline: matmul
            """,
        )
    )
    square, scalar, loss, conv, mlp = lhs
    assert square.inputs == [
        Tensor(Shape((1024, 1024), "f32", "rnd")),
        Tensor(Shape((1024, 1024), "f32", "id")),
    ]
    assert square.gflops == pytest.approx(1024**3 * 2 / 1e9)
    assert square.schedule_family == "matmul"
    # a quoted "1" is a one-element tensor, as lighthouse builds `1xf32xrnd`
    assert scalar.inputs[1] == Tensor(Shape((1,), "f32", "rnd"))
    assert scalar.schedule_family == "element_wise"
    # an unquoted number is a 1-D shape; "1" for a loss's result is its one-element buffer
    assert loss.inputs[1] == Tensor(Shape((32768,), "f32", "rnd"))
    assert loss.outputs == [Shape((1,), "f32")]
    assert loss.warning.startswith("RuntimeError: gather()")
    assert (loss.pipeline, loss.xfail) == (None, None)  # a warning expects nothing
    assert conv.outputs == [Shape((128,), "f32")]
    assert (conv.gflops, conv.warning) == (None, None)
    assert mlp.init_args == [128, [128], 128]
    assert mlp.gflops == pytest.approx((2 * 64 * 128 * 128 + 64 * 128 * 128 + 64 * 128) / 1e9)
    assert mlp.schedule_family == "matmul"


LIGHTHOUSE = os.environ.get("KBD_LIGHTHOUSE")


@pytest.mark.skipif(
    not LIGHTHOUSE, reason="KBD_LIGHTHOUSE (a folder of lighthouse's examples/KernelBench) not set"
)
def test_lighthouse_levels_files_load():
    """Lighthouse's own files, for local use: `KBD_LIGHTHOUSE=DIR` names a folder holding its
    level1.yaml, level2.yaml, level3.yaml and ci.yaml (never committed here)."""
    folder = Path(LIGHTHOUSE)
    levels = [folder / f"level{n}.yaml" for n in (1, 2, 3)]
    for path in [*levels, folder / "ci.yaml"]:
        raw = yaml.safe_load(path.read_text())
        entries = load_file(path)
        assert [e.kernel for e in entries] == [r["kernel"] for r in raw]
        assert [e.warning for e in entries] == [r.get("warning") for r in raw]
        assert [e.pipeline for e in entries] == [r.get("pipeline") for r in raw]
        assert all(e.inputs is not None and e.outputs is not None for e in entries)
    assert len(load(levels)) == sum(len(load_file(p)) for p in levels)  # together, as it runs


def test_repository_ci_file_loads():
    entries = load([catalog.LEVELS_DIR / "ci.yaml"])
    mlp = next(e for e in entries if e.kernel == "level3/1_MLP.py")
    assert mlp.init_args == [128, [128], 128]


# --- errors ----------------------------------------------------------------------------------


def test_no_files():
    with pytest.raises(InputError, match="no levels files found"):
        load([])


def test_unreadable_file(tmp_path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(InputError, match="cannot read levels file") as info:
        load([path])
    assert str(path) in str(info.value)


def test_malformed_yaml_names_line(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  gflops: [1, 2\n- kernel: x\n")
    assert "malformed YAML at line 3" in message


def test_malformed_yaml_tab(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n\tgflops: 1\n")
    assert "malformed YAML at line 2" in message


def test_not_a_list(tmp_path):
    assert "a levels file is a YAML list of entries" in error(tmp_path, "kernel: level1/1_K.py\n")


@pytest.mark.parametrize("item", ["level1/1_K.py", "[1, 2]", "42"])
def test_entry_not_a_mapping(tmp_path, item):
    message = error(tmp_path, f"- kernel: level1/0_ok.py\n- {item}\n")
    assert "entry 2: expected a mapping with a 'kernel' field" in message


@pytest.mark.parametrize(
    "text",
    [
        "- input_shapes: [4]\n",
        "- kernel: level1/1_K\n",
        "- kernel: 12\n",
        "- kernel: [level1/1_K.py]\n",
    ],
)
def test_missing_or_bad_kernel(tmp_path, text):
    assert "entry 1: field 'kernel' must be a path" in error(tmp_path, text)


def test_unknown_field(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  input_shape: [4]\n")
    assert "level1/1_K.py: unknown field 'input_shape'" in message


def test_bad_dtype(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  dtype: float32\n")
    assert "level1/1_K.py: field 'dtype': unknown type 'float32'" in message


def test_inits_without_shapes(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  initializations: [rnd]\n")
    assert "level1/1_K.py: field 'initializations' given without 'input_shapes'" in message


def test_shapes_not_a_list(tmp_path):
    message = error(
        tmp_path, "- kernel: level1/1_K.py\n  input_shapes: 4x4\n  initializations: [rnd]\n"
    )
    assert "level1/1_K.py: field 'input_shapes' must be a list" in message


@pytest.mark.parametrize("inits", ["[rnd]", "[rnd, rnd, rnd]", "rnd", None])
def test_inits_count_mismatch(tmp_path, inits):
    text = "- kernel: level1/1_K.py\n  input_shapes: [4x4, 4x4]\n"
    if inits is not None:
        text += f"  initializations: {inits}\n"
    message = error(tmp_path, text)
    assert "level1/1_K.py: field 'initializations' must list one init per input (2 inputs)" in (
        message
    )


@pytest.mark.parametrize("value", ["abc", "true", "4x4"])
def test_scalar_with_non_number(tmp_path, value):
    message = error(
        tmp_path,
        f"- kernel: level1/1_K.py\n  input_shapes: [4x4, {value}]\n"
        "  initializations: [rnd, scalar]\n",
    )
    assert "level1/1_K.py: input_shapes[1]: a 'scalar' input must be a number" in message


def test_number_without_scalar_init(tmp_path):
    message = error(
        tmp_path, "- kernel: level1/1_K.py\n  input_shapes: [3.14]\n  initializations: [rnd]\n"
    )
    assert "level1/1_K.py: input_shapes[0]: 3.14 is a number" in message


def test_bad_input_shape_names_index(tmp_path):
    message = error(
        tmp_path,
        "- kernel: level1/1_K.py\n  input_shapes: [4x4, 4x0]\n  initializations: [rnd, rnd]\n",
    )
    assert "level1/1_K.py: input_shapes[1]" in message
    assert "must be positive" in message


def test_bad_init_names_index(tmp_path):
    message = error(
        tmp_path,
        "- kernel: level1/1_K.py\n  input_shapes: [4x4]\n  initializations: [ones]\n",
    )
    assert "level1/1_K.py: input_shapes[0]" in message
    assert "unknown initialization 'ones'" in message


def test_bad_output_shape(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  output_shape: 4xf32\n")
    assert "level1/1_K.py: output_shape: bad dimensions" in message


def test_bad_output_shape_in_list(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  output_shape: [4x4, 4x0]\n")
    assert "level1/1_K.py: output_shape[1]: dimensions must be positive" in message


@pytest.mark.parametrize("value", ["(128,[128]", "foo", "'1 + '"])
def test_bad_init_args_string(tmp_path, value):
    message = error(tmp_path, f"- kernel: level3/1_MLP.py\n  init_args: {value}\n")
    assert "level3/1_MLP.py: field 'init_args'" in message
    assert "is not a literal like (128,[128],128)" in message


@pytest.mark.parametrize(
    "value", ["\"__import__('os')\"", "abc", "1/0", "'2 % 3'", "2 < 3", "'(1, 2)'", "'[1]'"]
)
def test_bad_gflops(tmp_path, value):
    message = error(tmp_path, f"- kernel: level1/1_K.py\n  gflops: {value}\n")
    assert "level1/1_K.py: field 'gflops'" in message
    assert "is not a number or arithmetic" in message


def test_optional_string_field(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  pipeline: [a]\n")
    assert "level1/1_K.py: field 'pipeline' must be a string" in message


def test_warning_must_be_a_string(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  warning: [slow]\n")
    assert "level1/1_K.py: field 'warning' must be a string" in message


def test_unknown_field_beside_lighthouse_fields(tmp_path):
    message = error(
        tmp_path,
        """
        - kernel: level1/1_K.py
          input_shapes: [64x128]
          initializations: [rnd]
          output_shape: 64x128
          warning: "error: failed to legalize operation 'torch.constant.bool'"

        - kernel: level1/2_K.py
          warnings: "one letter too many"
        """,
    )
    assert "levels.yaml: level1/2_K.py: unknown field 'warnings'" in message


@pytest.mark.parametrize("value", ["crash", "[crash]", "{phase: run}"])
def test_xfail_not_a_mapping_with_outcome(tmp_path, value):
    message = error(tmp_path, f"- kernel: level1/1_K.py\n  xfail: {value}\n")
    assert "level1/1_K.py: field 'xfail' must be a mapping with at least 'outcome'" in message


@pytest.mark.parametrize("outcome", ["pass", "xfail", "skipped", "crashed"])
def test_xfail_bad_outcome(tmp_path, outcome):
    message = error(tmp_path, f"- kernel: level1/1_K.py\n  xfail: {{outcome: {outcome}}}\n")
    assert f"level1/1_K.py: xfail outcome '{outcome}' is not one of" in message
    assert "mismatch, error, crash, timeout, memory" in message


def test_xfail_unknown_key(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n  xfail: {outcome: crash, signal: X}\n")
    assert "level1/1_K.py: field 'xfail' has unknown key 'signal'" in message


def test_duplicate_kernel_across_files(tmp_path):
    a = write(tmp_path, "- kernel: level1/1_K.py\n", "a.yaml")
    b = write(tmp_path, "- kernel: level1/2_L.py\n- kernel: level1/1_K.py\n", "b.yaml")
    with pytest.raises(InputError) as info:
        load([a, b])
    assert str(info.value) == f"{b}: kernel level1/1_K.py is also listed in {a}"


def test_duplicate_kernel_within_a_file(tmp_path):
    message = error(tmp_path, "- kernel: level1/1_K.py\n- kernel: level1/1_K.py\n")
    assert "kernel level1/1_K.py is also listed in" in message


def test_init_args_unhashable_literal_is_input_error(tmp_path):
    error(tmp_path, "- kernel: level3/1_MLP.py\n  init_args: '{[1]: 2}'\n")


@pytest.mark.parametrize("value", ["10.0 ** 400", "10 ** 400"])
def test_gflops_overflow_is_input_error(tmp_path, value):
    error(tmp_path, f"- kernel: level1/1_K.py\n  gflops: {value}\n")


def test_unknown_fields_of_mixed_key_types(tmp_path):
    error(tmp_path, "- kernel: level1/1_K.py\n  1: a\n  foo: b\n")


def test_zero_dimension_that_looks_like_hex(tmp_path):
    error(tmp_path, "- kernel: level1/1_K.py\n  input_shapes: [0x10]\n  initializations: [rnd]\n")


# --- select ----------------------------------------------------------------------------------


@pytest.fixture
def entries(tmp_path):
    return load_file(
        write(
            tmp_path,
            """
            - kernel: level1/2_Standard_matrix_multiplication_.py
            - kernel: level1/20_LeakyReLU.py
            - kernel: level1/3_Batched_matrix_multiplication.py
            - kernel: level2/2_ConvTranspose.py
            """,
        )
    )


def kernels(entries: list[Entry]) -> list[str]:
    return [e.kernel for e in entries]


def test_select_nothing_is_everything(entries):
    assert catalog.select(entries, []) == entries


def test_select_prefix_with_underscore_is_exact(entries):
    assert kernels(catalog.select(entries, ["level1/2_"])) == [
        "level1/2_Standard_matrix_multiplication_.py"
    ]


def test_select_prefix_without_underscore_matches_more(entries):
    assert kernels(catalog.select(entries, ["level1/2"])) == [
        "level1/2_Standard_matrix_multiplication_.py",
        "level1/20_LeakyReLU.py",
    ]


def test_select_several_prefixes_without_duplicates(entries):
    chosen = catalog.select(entries, ["level2/", "level1/2", "level1/2_"])
    assert kernels(chosen) == [
        "level2/2_ConvTranspose.py",
        "level1/2_Standard_matrix_multiplication_.py",
        "level1/20_LeakyReLU.py",
    ]


def test_select_unknown_prefix(entries):
    with pytest.raises(InputError, match="matches 'level4/'"):
        catalog.select(entries, ["level1/", "level4/"])


# --- KernelBench root ------------------------------------------------------------------------


def kernelbench(path: Path) -> Path:
    (path / "level1").mkdir(parents=True)
    return path


def test_root_option_wins(tmp_path, monkeypatch):
    option = kernelbench(tmp_path / "opt")
    monkeypatch.setenv("KBD_KERNELBENCH", str(kernelbench(tmp_path / "env")))
    monkeypatch.setattr(catalog, "DEFAULT_KERNELBENCH", kernelbench(tmp_path / "default"))
    assert kernelbench_root(str(option)) == option.resolve()


def test_root_env_beats_default(tmp_path, monkeypatch):
    env = kernelbench(tmp_path / "env")
    monkeypatch.setenv("KBD_KERNELBENCH", str(env))
    monkeypatch.setattr(catalog, "DEFAULT_KERNELBENCH", kernelbench(tmp_path / "default"))
    assert kernelbench_root(None) == env.resolve()


def test_root_default(tmp_path, monkeypatch):
    default = kernelbench(tmp_path / "default")
    monkeypatch.delenv("KBD_KERNELBENCH", raising=False)
    monkeypatch.setattr(catalog, "DEFAULT_KERNELBENCH", default)
    assert kernelbench_root(None) == default.resolve()


def test_root_option_missing_is_not_rescued_by_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KBD_KERNELBENCH", str(kernelbench(tmp_path / "env")))
    with pytest.raises(InputError) as info:
        kernelbench_root(str(tmp_path / "nowhere"))
    message = str(info.value)
    assert str(tmp_path / "nowhere") in message
    assert "--kernelbench" in message
    assert "git submodule update --init" in message


def test_root_env_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("KBD_KERNELBENCH", str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match="KBD_KERNELBENCH") as info:
        kernelbench_root(None)
    assert "git submodule update --init" in str(info.value)


def test_root_default_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("KBD_KERNELBENCH", raising=False)
    monkeypatch.setattr(catalog, "DEFAULT_KERNELBENCH", tmp_path / "nowhere")
    with pytest.raises(InputError, match="default location") as info:
        kernelbench_root(None)
    assert "git submodule update --init" in str(info.value)


def test_any_folder_holding_the_kernels_is_a_root(tmp_path):
    """A user's own problem folder needs no level* entry, only the selected kernels' files."""
    root = tmp_path / "mine"
    (root / "ops").mkdir(parents=True)
    (root / "ops" / "1_add.py").write_text("")
    assert kernelbench_root(str(root)) == root.resolve()
    levels = tmp_path / "levels.yaml"
    levels.write_text("- kernel: ops/1_add.py\n")
    check_sources(load_file(levels), root)
    levels.write_text("- kernel: ops/2_mul.py\n")
    with pytest.raises(InputError, match=r"ops/2_mul\.py does not exist"):
        check_sources(load_file(levels), root)


def test_check_sources(tmp_path, entries):
    root = tmp_path / "kb"
    for e in entries:
        (root / e.kernel).parent.mkdir(parents=True, exist_ok=True)
        (root / e.kernel).write_text("")
    check_sources(entries, root)
    (root / "level1/20_LeakyReLU.py").unlink()
    with pytest.raises(InputError) as info:
        check_sources(entries, root)
    message = str(info.value)
    assert message.startswith(f"{entries[0].levels_file}: kernel level1/20_LeakyReLU.py")
    assert f"does not exist in KernelBench at {root}" in message


# --- Expectation -----------------------------------------------------------------------------


def test_expectation_outcome_only():
    e = Expectation("crash")
    assert e.matches("crash", "run", "anything")
    assert not e.matches("error", "run", "anything")


def test_expectation_phase():
    e = Expectation("crash", phase="jit")
    assert e.matches("crash", "jit", "")
    assert not e.matches("crash", "run", "")


def test_expectation_message_prefix():
    e = Expectation("error", message="LLVM ERROR: foo")
    assert e.matches("error", "import", "LLVM ERROR: foo bar")
    assert e.matches("error", "import", "LLVM ERROR: foo")
    assert not e.matches("error", "import", "x LLVM ERROR: foo")
    assert not e.matches("error", "import", "LLVM ERROR: fo")


def test_expectation_all_fields():
    e = Expectation("mismatch", "check", "max abs")
    assert e.matches("mismatch", "check", "max abs error 1")
    assert not e.matches("mismatch", "run", "max abs error 1")
    assert not e.matches("crash", "check", "max abs error 1")
