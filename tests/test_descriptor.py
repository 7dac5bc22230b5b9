"""Pipeline descriptors: grammar, includes and variables, errors, the finder, real schedules."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from kbd.plan import target
from kbd.plan.descriptor import DEFAULT_PIPELINE, find_pipeline, host_target, resolve_pipeline
from kbd.shared.errors import InputError
from kbd.shared.protocol import Stage

SCHEDULES = Path(__file__).resolve().parent.parent / "schedules"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def descriptor(path: Path, *entries: str) -> Path:
    return write(path, "Pipeline:\n" + "".join(f"  - {entry}\n" for entry in entries))


def resolve(tmp_path: Path, *specs: str) -> list[Stage]:
    return resolve_pipeline(list(specs), schedules_dir=tmp_path / "schedules", cwd=tmp_path)


def texts(stages: list[Stage]) -> list[str]:
    return [stage.text for stage in stages]


def error(tmp_path: Path, *specs: str) -> str:
    with pytest.raises(InputError) as info:
        resolve(tmp_path, *specs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- grammar --------------------------------------------------------------------------------


def test_passes_are_normalised(tmp_path):
    path = write(
        tmp_path / "p.yaml",
        "Pipeline:\n"
        "  - pass: canonicalize\n"
        "  - pass: one-shot-bufferize{function-boundary-type-conversion=identity-layout-map\n"
        "      bufferize-function-boundaries}\n"
        "  - pass: x{a=True  b=FALSE list=[1, 2] n=3}\n"
        "  - pass: 'y {}'\n",
    )
    stages = resolve(tmp_path, "p.yaml")
    assert texts(stages) == [
        "canonicalize",
        "one-shot-bufferize{function-boundary-type-conversion=identity-layout-map "
        "bufferize-function-boundaries=true}",
        "x{a=true b=false list=[1,2] n=3}",
        "y",
    ]
    assert {stage.source for stage in stages} == {str(path.resolve())}
    assert {stage.kind for stage in stages} == {"pass"}


def test_command_line_specs(tmp_path):
    script = write(tmp_path / "schedules" / "transforms" / "t.mlir", "module {}")
    descriptor(tmp_path / "schedules" / "lower.yaml", "pass: cse")
    stages = resolve(
        tmp_path, "canonicalize", "test-pass{x=1 y}", "transforms/t.mlir", "lower", "lower.yaml"
    )
    assert texts(stages) == ["canonicalize", "test-pass{x=1 y=true}", str(script), "cse", "cse"]
    assert [stage.kind for stage in stages] == ["pass", "pass", "transform", "pass", "pass"]
    assert stages[1].source == "test-pass{x=1 y}"


def test_cwd_file_wins_over_schedules_dir(tmp_path):
    descriptor(tmp_path / "schedules" / "a.yaml", "pass: from-schedules")
    descriptor(tmp_path / "a.yaml", "pass: from-cwd")
    assert texts(resolve(tmp_path, "a.yaml")) == ["from-cwd"]
    assert texts(resolve(tmp_path, str(tmp_path / "schedules" / "a.yaml"))) == ["from-schedules"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("Not A Pass", "no such descriptor file or pass name"),
        ("missing.yaml", "no such descriptor file or pass name"),
        ("missing.mlir", "no such descriptor file or pass name"),
        ("gen.py", "use a .mlir transform script"),
        ("gen.py[gen=f]{x}", "use a .mlir transform script"),
        ("x{a=b=c}", "malformed option"),
        ("x{a", "unbalanced braces"),
        ("x{a}}", "unbalanced braces"),
        ("x{a=[1,2}", "unbalanced braces"),
        ("x{a=1 a=2}", "given twice"),
        ("x{a=}", "has no value"),
    ],
)
def test_bad_command_line_specs(tmp_path, spec, expected):
    message = error(tmp_path, spec)
    assert message.startswith(f"--pipeline {spec}: ")
    assert expected in message


# --- includes and variables ----------------------------------------------------------------


def test_include_with_variables_and_re_export(tmp_path):
    schedules = tmp_path / "schedules"
    descriptor(
        schedules / "inner.yaml",
        "pass: tile{sizes=$tile_size t=$tile}",
        "pass: p-$tile{x=$tile,$tile_size}",
    )
    descriptor(
        schedules / "mid.yaml",
        "include: inner.yaml {tile=$tile tile_size=[8,$tile]}",
        "pass: p{v=$tile}",
    )
    top = descriptor(tmp_path / "top.yaml", "include: mid.yaml {tile=4}", "pass: last")
    stages = resolve(tmp_path, str(top))
    assert texts(stages) == ["tile{sizes=[8,4] t=4}", "p-4{x=4,[8,4]}", "p{v=4}", "last"]
    assert [Path(stage.source).name for stage in stages] == [
        "inner.yaml",
        "inner.yaml",
        "mid.yaml",
        "top.yaml",
    ]


def test_variables_are_not_inherited(tmp_path):
    schedules = tmp_path / "schedules"
    inner = descriptor(schedules / "inner.yaml", "pass: cse", "pass: p{a=$tile}")
    descriptor(schedules / "mid.yaml", "include: inner.yaml")
    descriptor(tmp_path / "top.yaml", "include: mid.yaml {tile=4}")
    message = error(tmp_path, "top.yaml")
    assert message.startswith(f"{inner.resolve()}: Pipeline entry 2: ")
    assert "$tile" in message


def test_unresolved_variable_at_top_level(tmp_path):
    path = descriptor(tmp_path / "a.yaml", "pass: x{t=$tile_size}")
    message = error(tmp_path, "a.yaml")
    assert message.startswith(f"{path.resolve()}: Pipeline entry 1: ")
    assert "unresolved variable $tile_size" in message


def test_include_lookup_order(tmp_path):
    schedules = tmp_path / "schedules"
    descriptor(schedules / "shared.yaml", "pass: from-schedules")
    descriptor(schedules / "only.yaml", "pass: only-in-schedules")
    descriptor(tmp_path / "mine" / "shared.yaml", "pass: next-to-me")
    descriptor(tmp_path / "mine" / "top.yaml", "include: shared.yaml", "include: only.yaml")
    assert texts(resolve(tmp_path, "mine/top.yaml")) == ["next-to-me", "only-in-schedules"]


def test_include_is_not_resolved_against_cwd(tmp_path):
    descriptor(tmp_path / "cwd-only.yaml", "pass: cse")
    top = descriptor(tmp_path / "sub" / "top.yaml", "pass: cse", "include: cwd-only.yaml")
    message = error(tmp_path, "sub/top.yaml")
    assert message.startswith(f"{top.resolve()}: Pipeline entry 2: ")
    assert "'cwd-only.yaml' not found" in message


def test_transform_entries(tmp_path):
    here = write(tmp_path / "d" / "local.mlir", "module {}")
    shared = write(tmp_path / "schedules" / "transforms" / "t.mlir", "module {}")
    descriptor(tmp_path / "d" / "a.yaml", "transform: local.mlir", "transform: transforms/t.mlir")
    stages = resolve(tmp_path, "d/a.yaml")
    assert texts(stages) == [str(here), str(shared)]
    assert {stage.kind for stage in stages} == {"transform"}


def test_transform_variables_reach_into_the_script(tmp_path):
    write(tmp_path / "d" / "t.mlir", "tile_sizes [$m, $n] $m_n")
    descriptor(tmp_path / "d" / "inner.yaml", "transform: t.mlir {m=$rows n=16 m_n=x}")
    descriptor(tmp_path / "d" / "top.yaml", "include: inner.yaml {rows=8}")
    (stage,) = resolve(tmp_path, "d/top.yaml")
    assert stage.script == "tile_sizes [8, 16] x"
    assert stage.text == str(tmp_path / "d" / "t.mlir")
    (stage,) = resolve(tmp_path, "d/t.mlir{m=1 n=2 m_n=3}")
    assert stage.script == "tile_sizes [1, 2] 3"


def test_unset_script_variable_names_the_script(tmp_path):
    script = write(tmp_path / "d" / "t.mlir", "tile_sizes [$m, $n]")
    descriptor(tmp_path / "d" / "top.yaml", "transform: t.mlir {m=8}")
    message = error(tmp_path, "d/top.yaml")
    assert str(script) in message and "unresolved variable $n" in message


def test_include_cycle(tmp_path):
    schedules = tmp_path / "schedules"
    descriptor(schedules / "a.yaml", "pass: cse", "include: b.yaml")
    b = descriptor(schedules / "b.yaml", "include: a.yaml")
    message = error(tmp_path, "a")
    assert message.startswith(f"{b.resolve()}: Pipeline entry 1: ")
    assert "include cycle a.yaml -> b.yaml -> a.yaml" in message


def test_self_include_is_a_cycle(tmp_path):
    descriptor(tmp_path / "a.yaml", "include: a.yaml")
    assert "include cycle a.yaml -> a.yaml" in error(tmp_path, "a.yaml")


def test_same_file_twice_is_not_a_cycle(tmp_path):
    descriptor(tmp_path / "schedules" / "c.yaml", "pass: cse")
    descriptor(tmp_path / "a.yaml", "include: c.yaml", "include: c.yaml")
    assert texts(resolve(tmp_path, "a.yaml")) == ["cse", "cse"]


# --- descriptor errors ---------------------------------------------------------------------

BAD_FILES = [
    ("Pipeline: [pass: cse\n", "YAML syntax error at line"),
    ("", "expected a mapping with a 'Pipeline' key"),
    ("- pass: cse\n", "expected a mapping with a 'Pipeline' key"),
    ("pipeline:\n  - pass: cse\n", "expected a mapping with a 'Pipeline' key"),
    ("Pipeline: []\n", "'Pipeline' is empty"),
    ("Pipeline:\n", "'Pipeline' must be a list"),
    ("Pipeline:\n  - pass: cse\nExtra: 1\n", "unknown top-level key 'Extra'"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_FILES)
def test_bad_files(tmp_path, text, expected):
    path = write(tmp_path / "bad.yaml", text)
    message = error(tmp_path, "bad.yaml")
    assert message.startswith(f"{path.resolve()}: ")
    assert expected in message


BAD_ENTRIES = [
    ("pass: cse\n    transform: t.mlir", "single-key mapping"),
    ("cse", "single-key mapping"),
    ("schedule: x.mlir", "unknown key 'schedule'"),
    ("pass: 3", "must be a non-empty string"),
    ("pass: [a, b]", "must be a non-empty string"),
    ("pass: ''", "must be a non-empty string"),
    ("pass: x{a=b=c}", "malformed option 'a=b=c'"),
    ("pass: x{a b", "unbalanced braces"),
    ("pass: x}", "unbalanced braces"),
    ("pass: Bad_Name", "bad pass name 'Bad_Name'"),
    ("pass: x{a.b=1}", "bad option name 'a.b'"),
    ("include: missing.yaml", "'missing.yaml' not found"),
    ("include: other.txt", "include expects a .yaml descriptor"),
    ("include: c.yaml {a-b=1}", "bad variable name 'a-b'"),
    ("include: c.yaml {t=1 t=2}", "given twice"),
    ("transform: missing.mlir", "'missing.mlir' not found"),
    ("transform: gen.py[gen=f]", "use a .mlir transform script"),
    ("transform: t.mlir[x]", "transform expects a .mlir script path"),
    ("transform: t.yaml {x=1}", "transform expects a .mlir script path"),
]


@pytest.mark.parametrize(("entry", "expected"), BAD_ENTRIES)
def test_bad_entries(tmp_path, entry, expected):
    descriptor(tmp_path / "schedules" / "c.yaml", "pass: cse")
    write(tmp_path / "t.mlir", "module {}")
    path = descriptor(tmp_path / "bad.yaml", "pass: cse", entry)
    message = error(tmp_path, "bad.yaml")
    assert message.startswith(f"{path.resolve()}: Pipeline entry 2: ")
    assert expected in message


def test_errors_in_included_files_name_that_file(tmp_path):
    inner = write(tmp_path / "schedules" / "inner.yaml", "Pipeline: [")
    descriptor(tmp_path / "top.yaml", "include: inner.yaml")
    assert error(tmp_path, "top.yaml").startswith(f"{inner.resolve()}: YAML syntax error")


# --- finder and host ------------------------------------------------------------------------


def test_finder_layout(tmp_path):
    plain = write(tmp_path / "x86_64" / "matmul" / "f32.yaml", "")
    amx = write(tmp_path / "x86_64" / "amx_bf16" / "matmul" / "f32.yaml", "")
    avx = write(tmp_path / "x86_64" / "avx512f" / "matmul" / "f32.yaml", "")

    def find(name="matmul", dtype="f32", arch="x86_64", features=()):
        return find_pipeline(name, dtype, schedules_dir=tmp_path, arch=arch, features=features)

    assert find() == plain
    assert find(features=["sse", "amx_bf16", "avx512f"]) == amx
    assert find(features=["avx512f", "amx_bf16"]) == avx
    assert find(features=["sse"]) == plain
    assert find(dtype="bf16", features=["amx_bf16"]) is None
    assert find(name="conv") is None
    assert find(name="") is None
    assert find(arch="aarch64") is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse2 avx avx2 fma avx512f avx512bw avx512vl", "avx512f"),  # avx2 is listed first
        ("avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "amx_bf16"),
        ("amx_bf16 avx2", "amx_bf16"),
        ("sse4_2 avx avx2 fma", "avx2"),
        ("sse sse2 avx512f", "avx512f"),
        ("sse sse2", None),
        ("", None),
    ],
)
def test_the_finder_prefers_the_widest_and_newest_host_feature(tmp_path, flags, expected):
    """Host features are tried in RANKING order, whatever order /proc/cpuinfo lists them in."""
    for directory in ("", "amx_bf16", "avx512f", "avx2", "sse2"):
        write(tmp_path / "x86_64" / directory / "matmul" / "f32.yaml", "")
    found = find_pipeline(
        "matmul",
        "f32",
        schedules_dir=tmp_path,
        arch="x86_64",
        features=target.ranked(flags.split()),
    )
    assert found == tmp_path / "x86_64" / (expected or "") / "matmul" / "f32.yaml"
    assert target.ranked(flags.split()) == [f for f in target.RANKING if f in flags.split()]


def test_the_finder_looks_for_the_dtype_in_bf16_feature_folders_first_then_the_arch(tmp_path):
    """A bf16 kernel on a CPU with avx512_bf16: schedules/x86_64/avx512_bf16/<family>/bf16.yaml,
    then the wider feature folders' bf16.yaml, then the architecture's; never an f32 schedule;
    none at all is the scalar pipeline's case (None)."""
    bf16_native = write(tmp_path / "x86_64" / "avx512_bf16" / "matmul" / "bf16.yaml", "")
    bf16_plain = write(tmp_path / "x86_64" / "matmul" / "bf16.yaml", "")
    write(tmp_path / "x86_64" / "avx512f" / "matmul" / "f32.yaml", "")
    write(tmp_path / "x86_64" / "avx512f" / "softmax" / "f32.yaml", "")
    features = target.ranked(["avx2", "avx512f", "avx512_bf16"])
    assert features == ["avx512_bf16", "avx512f", "avx2"]

    def find(name: str, dtype: str, features=features):
        return find_pipeline(name, dtype, schedules_dir=tmp_path, arch="x86_64", features=features)

    assert find("matmul", "bf16") == bf16_native
    assert find("matmul", "bf16", features=["avx512f", "avx2"]) == bf16_plain  # an older CPU
    assert find("matmul", "f32") == tmp_path / "x86_64" / "avx512f" / "matmul" / "f32.yaml"
    assert find("softmax", "bf16") is None
    assert find("softmax", "f16") is None


def test_every_feature_with_llvm_features_is_ranked():
    assert set(target.LLVM_FEATURES) <= set(target.RANKING)


def test_host_target():
    arch, features = host_target()
    assert arch == platform.machine()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = next(
        line.partition(":")[2].split()
        for line in cpuinfo.splitlines()
        if line.partition(":")[0].strip() in ("flags", "Features")
    )
    assert features == flags and features  # the machine's flags, none lost


# --- the real schedules --------------------------------------------------------------------

LLVM_LOWERING = [
    "fold-memref-alias-ops",
    "expand-strided-metadata",
    "canonicalize",
    "convert-vector-to-scf",
    "kbd-hoist-allocas",
    "lower-affine",
    "convert-scf-to-cf",
    "finalize-memref-to-llvm",
    "kbd-contract-float-arithmetic",
    "convert-vector-to-llvm{enable-x86=true reassociate-fp-reductions=true}",
    "convert-math-to-llvm",
    "convert-math-to-libm",
    "convert-to-llvm",
    "reconcile-unrealized-casts",
]
BUFFERIZATION = [
    "eliminate-empty-tensors",
    "one-shot-bufferize{function-boundary-type-conversion=identity-layout-map "
    "bufferize-function-boundaries=true}",
    "drop-equivalent-buffer-results",
]
BUFFERIZATION_CLEANUP = [
    "buffer-deallocation-pipeline",
    "convert-bufferization-to-memref",
    "kbd-dealloc-after-last-use",
    "kbd-outputs-in-place",
    "cse",
    "canonicalize",
]


def real(*specs: str) -> list[Stage]:
    return resolve_pipeline(list(specs), schedules_dir=SCHEDULES, cwd=Path("/"))


def test_scalar_lowering_is_the_default():
    stages = real("scalar-lowering")
    assert texts(stages) == [
        "tosa-to-linalg-pipeline",
        *BUFFERIZATION,
        *BUFFERIZATION_CLEANUP,
        "convert-linalg-to-loops",
        *LLVM_LOWERING,
    ]
    assert {stage.kind for stage in stages} == {"pass"}
    assert texts(real(DEFAULT_PIPELINE)) == texts(stages)


def test_tiled_lowering_uses_a_transform_and_a_variable():
    stages = real("tiled-lowering.yaml")
    assert texts(stages) == [
        "tosa-to-linalg-pipeline",
        str(SCHEDULES / "transforms" / "tile-linalg.mlir"),
        "cse",
        "canonicalize",
        *BUFFERIZATION,
        *BUFFERIZATION_CLEANUP,
        "convert-linalg-to-parallel-loops",
        "scf-parallel-loop-tiling{parallel-loop-tile-sizes=8,16}",
        "cse",
        "canonicalize",
        *LLVM_LOWERING,
    ]
    assert stages[1].kind == "transform"


@pytest.mark.parametrize("name", ["cleanup", "bufferization", "bufferization-cleanup"])
def test_every_shared_schedule_expands(name):
    assert all(stage.kind == "pass" for stage in real(name))
