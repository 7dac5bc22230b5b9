"""The compile cache: content addresses, verified entries, and real runs that use it."""

from __future__ import annotations

from pathlib import Path

import msgspec

from kbd.caches import compile_cache, import_cache
from kbd.daemon.state import StatePaths
from kbd.shared.protocol import BenchOptions, CompileCache, Job, Library, Limits, Signature, Stage
from tests.conftest import FIXTURE_KB, json_records, kbd

LIBRARY = Library(
    key="cd" * 32,
    data=b"\x7fELF not really a library",
    signature=Signature(outputs=[((8, 64), "f32")], inputs=[((8, 64), "f32")], mutated=()),
)
FIXTURES = Path(__file__).parent / "fixtures"


def _job(**changes) -> Job:
    job = Job(
        kernel="level1/k.py",
        source="/kb/level1/k.py",
        source_text="class Model: ...\n",
        inputs=None,
        init_args=None,
        outputs=None,
        dtype="f32",
        stages=[Stage(kind="pass", text="convert-to-llvm", source="x.yaml")],
        seed=0,
        tolerance=0.01,
        max_tolerance=1.0,
        opt_level=3,
        limits=Limits(),
    )
    return msgspec.structs.replace(job, **changes)


def _cache(tmp_path: Path, key: str = LIBRARY.key) -> CompileCache:
    return CompileCache(key=key, directory=str(tmp_path / "cache"), max_bytes=1 << 20)


def test_key_follows_what_the_compiled_code_depends_on():
    base = compile_cache.key(_job())
    assert compile_cache.key(_job()) == base
    other_pass = [Stage(kind="pass", text="canonicalize", source="x.yaml")]
    script = [Stage(kind="transform", text="/t.mlir", source="x.yaml", script="module {}")]
    edited = [Stage(kind="transform", text="/t.mlir", source="x.yaml", script="module { }")]
    for changed in (
        _job(stages=other_pass),
        _job(stages=script),
        _job(opt_level=0),
        _job(bench=BenchOptions()),  # timing loops are compiled in
        _job(source_text="class Model: pass\n"),  # what the import depends on, too
        _job(seed=1),
        _job(dtype="f64"),
    ):
        assert compile_cache.key(changed) != base
    assert compile_cache.key(_job(stages=script)) != compile_cache.key(_job(stages=edited))
    # tolerances, limits and where the source lives do not change the code
    same = _job(tolerance=0.1, limits=Limits(mem_limit=1 << 30), source="/elsewhere/k.py")
    assert compile_cache.key(same) == base
    # the import cache's key is part of it, not the other way round
    assert import_cache.key(_job(opt_level=0)) == import_cache.key(_job())


def test_entry_round_trips_and_installs_into_the_scratch_folder(tmp_path):
    cache = _cache(tmp_path)
    assert compile_cache.lookup(cache) is None
    compile_cache.store(cache, LIBRARY)
    found = compile_cache.lookup(cache)
    assert found == LIBRARY
    job = _job(compile_cache=cache)
    installed = compile_cache.install(job, found, tmp_path)
    assert Path(installed.compile_cache.library).read_bytes() == LIBRARY.data
    assert installed.compile_cache.signature == LIBRARY.signature


def test_damaged_or_foreign_entries_are_removed_never_used(tmp_path):
    cache = _cache(tmp_path)
    path = Path(cache.directory) / cache.key[:2] / f"{cache.key}{compile_cache.SUFFIX}"
    for damage in (
        lambda data: data[:-5],  # truncated
        lambda data: data.replace(b"not really", b"not reallY"),  # flipped byte, same size
        lambda data: data.split(b"\n", 1)[1],  # header lost
        lambda data: b"",
    ):
        compile_cache.store(cache, LIBRARY)
        path.write_bytes(damage(path.read_bytes()))
        assert compile_cache.lookup(cache) is None
        assert not path.exists()
    # a valid entry filed under another key (e.g. copied by hand) is not used for this one
    other = _cache(tmp_path, key="ef" * 32)
    compile_cache.store(other, LIBRARY)
    assert compile_cache.lookup(other) is None


def test_reruns_use_both_caches_with_the_same_results(tmp_path):
    """A second run loads each kernel's library instead of importing, lowering and compiling;
    outcomes and errors are those of the first run (a mismatch stays a mismatch, state a
    forward writes is still carried out, --benchmark times the library's loops). Without the
    compile cache a rerun reads the imported modules from the import cache. Damage to either
    cache is rebuilt; each has an option that bypasses it. (One sequence of runs for both
    caches. The first run is a process of its own; the reruns go through a daemon, as they do
    for a user who has one running, so the caches a process filled serve the daemon too, and
    the reruns do not start a template each.)"""
    levels = tmp_path / "levels.yaml"
    levels.write_text(
        (FIXTURES / "levels.yaml").read_text() + "- kernel: level7/5_buffer_mutation.py\n"
    )
    kernels = ("level1/1_", "level1/2_", "level9/1_", "level7/5_")
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(levels), *kernels, "--json"]
    args += ["-j", "2", "-O", "1", "--benchmark", "--bench-time", "0", "--bench-samples", "1"]
    args += ["--bench-processes", "1"]  # the caches, not the processes (test_bench.py), are tested
    first = json_records(kbd("run", *args, cwd=tmp_path).stdout)
    assert {r["compile_cache"] for r in first.values()} == {"miss"}
    assert {r["import_cache"] for r in first.values()} == {"miss"}
    entries = sorted((tmp_path / ".kbd" / "compile-cache").glob("*/*.so.entry"))
    assert len(entries) == 4
    started = kbd("daemon", "start", "--idle-timeout", "300", cwd=tmp_path, timeout=180)
    assert started.returncode == 0, started.stderr
    try:
        _reruns(args, first, entries, tmp_path)
        log = StatePaths.for_store(tmp_path / ".kbd" / "results.db").log.read_text()
        assert "run 4: 4 kernels" in log  # the four reruns ran in the daemon
    finally:
        kbd("daemon", "stop", "--now", cwd=tmp_path, timeout=60)


def _reruns(args: list[str], first: dict[str, dict], entries: list[Path], tmp_path: Path) -> None:
    """The reruns of test_reruns_use_both_caches_with_the_same_results, in the daemon."""
    second = json_records(kbd("run", *args, cwd=tmp_path).stdout)
    assert {r["compile_cache"] for r in second.values()} == {"hit"}
    assert {r["import_cache"] for r in second.values()} == {None}  # nothing was imported
    for kernel, record in first.items():
        again = second[kernel]
        assert "pipeline" not in again["times"] and "jit" not in again["times"]
        for field in ("outcome", "phase", "max_abs_error", "passing_tolerance", "state_writes"):
            assert again[field] == record[field], (kernel, field)
        assert (again["bench"] is None) == (record["bench"] is None)  # timed from the library
    assert {k: r["outcome"] for k, r in first.items()} == {
        "level1/1_matmul": "pass",
        "level1/2_relu_scale": "pass",
        "level9/1_mismatch": "mismatch",
        "level7/5_buffer_mutation": "pass",
    }
    assert first["level7/5_buffer_mutation"]["state_writes"] == ["running"]

    entries[0].write_bytes(entries[0].read_bytes()[:-10])  # truncated: rebuilt, not used
    third = json_records(kbd("run", *args, cwd=tmp_path).stdout)
    assert sorted(r["compile_cache"] for r in third.values()) == ["hit", "hit", "hit", "miss"]
    imported = sorted((tmp_path / ".kbd" / "import-cache").glob("*/*.mlir"))
    assert len(imported) == 4
    imported[0].write_bytes(imported[0].read_bytes()[:-10])  # truncated: rebuilt, not used
    bypass = json_records(kbd("run", *args, "--no-compile-cache", cwd=tmp_path).stdout)
    assert {r["compile_cache"] for r in bypass.values()} == {None}
    assert sorted(r["import_cache"] for r in bypass.values()) == ["hit", "hit", "hit", "miss"]
    no_cache = ["--no-compile-cache", "--no-import-cache"]
    neither = json_records(kbd("run", *args, *no_cache, cwd=tmp_path).stdout)
    assert {(r["compile_cache"], r["import_cache"]) for r in neither.values()} == {(None, None)}
    for records in (third, bypass, neither):
        assert {k: r["outcome"] for k, r in records.items()} == {
            k: r["outcome"] for k, r in first.items()
        }


def test_inductor_folders_are_per_kernel_source_and_evicted_least_recently_used(tmp_path: Path):
    """A kernel's Inductor folder follows its source and element type, is made when the kernel
    runs, and whole folders go oldest first beyond the cap, never the one just used."""
    import os

    from kbd.caches import inductor_cache

    directory = tmp_path / "inductor-cache"
    job = _job(bench=BenchOptions(inductor=True))
    attached = inductor_cache.attach(job, directory)
    folder = Path(attached.bench.inductor_cache)
    assert not folder.exists() and folder.parent == directory and folder.name.startswith("k-")
    assert inductor_cache.ready(folder) and folder.is_dir()
    assert inductor_cache.folder(directory, job) == folder
    assert inductor_cache.folder(directory, _job(source_text="class Model: pass\n")) != folder
    assert inductor_cache.folder(directory, _job(dtype="bf16")) != folder
    assert attached.bench.per_process(1).inductor_cache == str(folder)

    folders = [directory / name for name in ("old", "middle", "new")]
    for age, path in enumerate(folders):
        path.mkdir()
        (path / "graph.so").write_bytes(b"x" * 1000)
        os.utime(path, (1000 + age, 1000 + age))
    os.utime(folder, (999, 999))  # the oldest, but the sweep's own
    inductor_cache.evict(directory, 2000, keep=frozenset({folder}))
    assert [p.name for p in sorted(directory.iterdir())] == sorted([folder.name, "middle", "new"])
    inductor_cache.evict(directory, 0, keep=frozenset({folder}))
    assert list(directory.iterdir()) == [folder]


def test_an_inductor_folder_that_cannot_be_made_is_not_ready(tmp_path: Path):
    """The runner then gives the kernel a temporary folder, as without the compile cache."""
    from kbd.caches import inductor_cache

    (tmp_path / "file").write_text("")
    job = inductor_cache.attach(_job(bench=BenchOptions(inductor=True)), tmp_path / "file")
    assert not inductor_cache.ready(Path(job.bench.inductor_cache))
