"""`kbd tune`: spaces declared in descriptors, the search, faults as data, resume after kill -9,
the tuning database, and tuned configurations applied by the finder (and not with --untuned)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from kbd.engine import prepare
from kbd.plan import catalog, descriptor, space, tuned
from kbd.plan.spec import SweepSpec
from kbd.results.tuning import Trial
from kbd.shared.errors import InputError
from kbd.tune.search import Search
from tests.conftest import FIXTURE_KB, ROOT, json_records, kbd

TUNABLE = ROOT / "tests" / "fixtures" / "schedules" / "tunable" / "tunable.yaml"
SCHEDULES = ROOT / "schedules"


def _descriptor(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "d.yaml"
    path.write_text(text)
    return path


SMALL = """\
Vars: {a: 2, b: 16, c: x}
Tune:
  space:
    a: [1, 2, 4]
    b: {pow2: [8, 64]}
  constraints:
    - a * b / lanes <= 4
Pipeline:
  - pass: canonicalize{max-iterations=$a}
"""


def test_a_space_is_read_with_its_domains_constraints_and_the_default_first(tmp_path):
    tunable = space.load(_descriptor(tmp_path, SMALL))
    assert tunable.domains == {"a": [1, 2, 4], "b": [8, 16, 32, 64]}
    assert tunable.size() == 12
    configs = tunable.configs(space.Target(lanes=16, vregs=32))
    assert configs[0] == {"a": 2, "b": 16}
    assert all(c["a"] * c["b"] / 16 <= 4 for c in configs)
    assert len(configs) == len({tuned.config_text(c) for c in configs}) == 9
    assert tunable.valid({"a": 4, "b": 64}, space.Target(16, 32)) == "a * b / lanes <= 4"


@pytest.mark.parametrize(
    ("tune", "message"),
    [
        ("space: {z: [1]}", "'z' is not one of the descriptor's Vars"),
        ("space: {a: []}", "a domain is a list of values or {pow2: [low, high]}"),
        ("space: {a: {pow2: [3, 8]}}", "a domain is a list of values"),
        ("space: {a: [1, 1]}", "a value is listed twice"),
        ("space: {a: [1]}\n  constraints: ['__import__(\"os\")']", "only min(...) and max(...)"),
        ("space: {a: [1]}\n  constraints: ['a.real > 0']", "Attribute is not allowed"),
        ("space: {a: [1]}\n  constraints: ['q > 1']", "unknown name 'q'"),
        ("spaces: {a: [1]}", "expected a mapping with 'space'"),
    ],
)
def test_a_bad_space_is_one_error_naming_the_file_and_what(tmp_path, tune, message):
    text = f"Vars: {{a: 2}}\nTune:\n  {tune}\nPipeline:\n  - pass: canonicalize\n"
    with pytest.raises(InputError, match=None) as error:
        space.load(_descriptor(tmp_path, text))
    assert str(error.value).startswith(str(tmp_path / "d.yaml"))
    assert message in str(error.value)


def test_vars_are_defaults_that_a_command_line_spec_overrides_and_typos_are_errors(tmp_path):
    path = _descriptor(tmp_path, SMALL)
    (stage,) = descriptor.resolve_pipeline([str(path)], schedules_dir=SCHEDULES, cwd=tmp_path)
    assert stage.text == "canonicalize{max-iterations=2}"
    (stage,) = descriptor.resolve_pipeline(
        [f"{path}{{a=4}}"], schedules_dir=SCHEDULES, cwd=tmp_path
    )
    assert stage.text == "canonicalize{max-iterations=4}"
    with pytest.raises(InputError, match=r"no variable 'aa' to set \(its Vars: a, b, c\)"):
        descriptor.resolve_pipeline([f"{path}{{aa=4}}"], schedules_dir=SCHEDULES, cwd=tmp_path)


def test_every_tunable_family_schedule_has_a_valid_default_and_a_space():
    tunable = [p for p in SCHEDULES.glob("x86_64/**/*.yaml") if space.load(p) is not None]
    assert len(tunable) >= 6  # matmul, batch matmul and conv2d, for AVX2 and AVX-512
    for path in tunable:
        features = ["avx512f"] if "avx512" in str(path) else ["avx2"]
        loaded = space.load(path)
        target = space.target_for(features)
        assert loaded.valid(loaded.default(), target) is None, path
        assert len(loaded.configs(target)) > 50, path


def _trial(config, outcome="pass", speedup=1.0):
    timed = outcome == "pass"
    return Trial(
        config=config,
        stage="search",
        outcome=outcome,
        phase="bench" if timed else "run",
        speedup=speedup if timed else None,
        low=speedup if timed else None,
        high=speedup if timed else None,
    )


def test_a_space_within_the_budget_is_measured_whole_and_nothing_twice(tmp_path):
    tunable = space.load(_descriptor(tmp_path, SMALL))
    configs = tunable.configs(space.Target(16, 32))
    search = Search(tunable, configs, budget=20)
    assert search.exhaustive
    trials = []
    while batch := search.next(trials, 4):
        trials += [_trial(c, "crash" if c["a"] == 4 else "pass") for c in batch]
    assert sorted(tuned.config_text(t.config) for t in trials) == sorted(
        tuned.config_text(c) for c in configs
    )


def test_a_search_keeps_to_its_budget_never_repeats_and_climbs_to_the_best():
    """On matmul's AVX-512 space (hundreds of configurations) with a smooth made-up score, a
    budget of 40 ends within a few percent of the best, measuring 40 distinct configurations;
    failing ones are never proposed again."""
    path = SCHEDULES / "x86_64" / "avx512f" / "matmul" / "f32.yaml"
    tunable = space.load(path)
    configs = tunable.configs(space.target_for(["avx512f"]))

    def score(c):
        return 10 - abs(c["reg_m"] - 6) - abs(c["reg_n"] - 48) / 16 - abs(c["block_k"] - 256) / 256

    search = Search(tunable, configs, budget=40, seed=3)
    trials: list[Trial] = []
    while batch := search.next(trials, 4):
        for c in batch:
            failing = c["block_m"] == 512
            trials.append(_trial(c, "timeout" if failing else "pass", score(c)))
    texts = [tuned.config_text(t.config) for t in trials]
    assert len(texts) == len(set(texts)) == 40
    assert trials[0].config == tunable.default()
    best = max(t.speedup for t in trials if t.timed)
    assert best >= 0.95 * max(score(c) for c in configs if c["block_m"] != 512)


# Quick tunes (tests through the daemon and on a cluster): short timings, one confirmation
# process each.
QUICK = ("--bench-time", "0.1", "--search-time", "0.05", "--bench-processes", "1")


def tunable(folder: Path, variants: list[str], default: str = "ok") -> Path:
    """The fixture's tunable schedule with only `variants` in its space (default `default`),
    written into `folder`: e.g. [ok, wrong] for three quick configurations."""
    path = folder / f"tunable-{'-'.join(variants)}.yaml"
    path.write_text(
        TUNABLE.read_text()
        .replace("Vars: {variant: ok, rounds: 1}", f"Vars: {{variant: {default}, rounds: 1}}")
        .replace("variant: [ok, wrong, segv, hang, memory]", f"variant: [{', '.join(variants)}]")
        .replace("pad-$variant.mlir", f"{TUNABLE.parent}/pad-$variant.mlir")
    )
    return path


def trials_of(path: Path) -> list[tuple]:
    """(tune_id, config, stage, outcome, phase, message) of every trial, in order."""
    return _trials(path)


def _tune(tmp_path, *extra, db="tune.db", timeout=300):
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(ROOT / "tests/fixtures/levels.yaml")]
    args += ["level1/1_", "--pipeline", str(TUNABLE), "--mem-limit", "1GiB", "--timeout", "8"]
    args += ["--db", str(tmp_path / db), "--bench-time", "0.2", "--search-time", "0.05"]
    return kbd("tune", *args, *extra, cwd=tmp_path, timeout=timeout)


def _trials(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT tune_id, config, stage, outcome, phase, message FROM trials ORDER BY id"
        ).fetchall()


def test_faulty_configurations_are_classified_once_and_the_tune_completes(tmp_path):
    """The fixture space: wrong results, a segfault, a run of minutes, 4 GiB under a 1 GiB
    limit (compiled code gets NULL from malloc: `memory` where it ran, naming the size), and
    two good ones."""
    result = _tune(tmp_path)
    assert result.returncode == 0, result.stderr
    trials = [t for t in _trials(tmp_path / "tune.db") if t[2] == "search"]
    outcomes = {
        json.loads(config)["variant"]: (outcome, phase, message)
        for _, config, _, outcome, phase, message in trials
        if json.loads(config)["rounds"] == 1
    }
    assert outcomes["wrong"][0] == "mismatch"
    assert outcomes["segv"][:2] == ("crash", "run") and "SIGSEGV" in outcomes["segv"][2]
    assert outcomes["hang"][0] == "timeout"
    assert outcomes["memory"][:2] == ("memory", "run")
    assert (
        "allocation of 4294967360 bytes (4.0 GiB) failed (limit 1.0 GiB)" in outcomes["memory"][2]
    )
    assert outcomes["ok"][0] == "pass"
    assert len(trials) == 6 and "measuring every configuration" in result.stderr
    assert "1 mismatch, 1 crash, 1 timeout, 1 memory" in result.stdout
    # The HTML report's tuning section shows the session as its summary table did.
    page = tmp_path / "tune.html"
    shown = kbd("results", "--db", str(tmp_path / "tune.db"), "--html", str(page), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = re.search(r"id='kbd-tuning'>(.*?)</script>", page.read_text()).group(1)
    (task,) = json.loads(data)["tasks"]
    assert task["failures"] == {"mismatch": 1, "crash": 1, "timeout": 1, "memory": 1}
    assert (task["configs"], task["measured"]) == (6, 6)
    assert task["verdict"] in result.stdout.splitlines()[-1]
    # A new session measures the good configurations again, never the failing ones.
    again = _tune(tmp_path)
    assert again.returncode == 0, again.stderr
    second = [t for t in _trials(tmp_path / "tune.db") if t[0] == 2 and t[2] == "search"]
    assert sorted(json.loads(t[1])["variant"] for t in second) == ["ok", "ok"]
    # ...and its summary counts the failures it worked from, as the first's did.
    assert "1 mismatch, 1 crash, 1 timeout, 1 memory" in again.stdout


def test_a_kernel_whose_every_configuration_fails_ends_the_tune_with_status_1(tmp_path):
    failing = tunable(tmp_path, ["wrong", "segv"], default="wrong")
    args = ["--kernelbench", str(FIXTURE_KB), "--levels", str(ROOT / "tests/fixtures/levels.yaml")]
    args += ["level1/1_", "--pipeline", str(failing), "--db", str(tmp_path / "t.db")]
    result = kbd("tune", *args, cwd=tmp_path)
    assert result.returncode == 1
    assert "level1/1_matmul: no configuration passed and was timed" in result.stderr
    assert "every configuration failed" in result.stdout


def test_resume_after_kill_9_measures_no_finished_configuration_twice(tmp_path):
    args = [sys.executable, "-m", "kbd", "tune", "--kernelbench", str(FIXTURE_KB)]
    args += ["--levels", str(ROOT / "tests/fixtures/levels.yaml"), "level1/1_"]
    args += ["--pipeline", str(TUNABLE), "--mem-limit", "1GiB", "--timeout", "8", "-j", "1"]
    args += ["--db", str(tmp_path / "tune.db"), "--bench-time", "0.2", "--search-time", "0.05"]
    process = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError):  # the store not yet made
            if (tmp_path / "tune.db").exists() and len(_trials(tmp_path / "tune.db")) >= 2:
                break
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = _trials(tmp_path / "tune.db")
    assert 2 <= len(before) < 6
    resumed = kbd("tune", "--resume", "--db", str(tmp_path / "tune.db"), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming session 1" in resumed.stderr
    search = [t[1] for t in _trials(tmp_path / "tune.db") if t[2] == "search"]
    assert len(search) == len(set(search)) == 6


def test_tuned_configurations_apply_on_an_exact_key_and_export_and_import(tmp_path):
    """An imported configuration for the fixture matmul's task runs (the record's pipeline
    says so), not with --untuned nor for another shape; export writes it back."""
    levels, other = tmp_path / "levels.yaml", tmp_path / "other.yaml"
    for path, rows in ((levels, 32), (other, 16)):
        path.write_text(
            f"- kernel: level1/1_matmul.py\n  input_shapes: [{rows}x48, 48x16]\n"
            "  initializations: [rnd, rnd]\n  family: matmul\n"
        )
    options = SweepSpec(levels=(str(levels),), kernelbench=str(FIXTURE_KB), cwd=str(tmp_path))
    chooser = prepare.chooser_for(options, None)
    entry = catalog.load([levels])[0]
    path = chooser.descriptor_for(entry)
    if path is None or space.load(path) is None:
        pytest.skip("no tunable matmul schedule for this CPU")
    key = chooser.task(entry, path)
    config = {**space.load(path).default(), "reg_m": 4}
    line = tuned.Tuned(key=key, kernel=entry.name, config=config, adopted=True, gain=1.2)
    (tmp_path / "in.jsonl").write_text(tuned.jsonl([line]))
    imported = kbd("tune", "--import", "in.jsonl", cwd=tmp_path)
    assert imported.returncode == 0 and "imported 1 tuned configurations" in imported.stdout
    run = kbd(
        "run", "--kernelbench", str(FIXTURE_KB), "--levels", str(levels), "--json", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    (record,) = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")][:1]
    assert record["pipeline"].endswith("reg_m=4 reg_n=" + str(config["reg_n"]) + "} (tuned)")
    assert record["outcome"] == "pass"
    untuned = kbd(
        "run",
        "--kernelbench",
        str(FIXTURE_KB),
        "--levels",
        str(levels),
        "--json",
        "--untuned",
        cwd=tmp_path,
    )
    assert "(tuned)" not in untuned.stdout
    shape = kbd(
        "run", "--kernelbench", str(FIXTURE_KB), "--levels", str(other), "--json", cwd=tmp_path
    )
    assert shape.returncode == 0 and "(tuned)" not in shape.stdout
    exported = kbd("tune", "--export", "out.jsonl", cwd=tmp_path)
    assert exported.returncode == 0
    assert tuned.read_jsonl(tmp_path / "out.jsonl") == [line]


def test_json_records_of_runs_are_unchanged_by_tuning_tables(tmp_path):
    """A store with tuning tables still serves sweeps (the tables share the file)."""
    sweep = kbd(
        "sweep",
        "--kernelbench",
        str(FIXTURE_KB),
        "--levels",
        str(ROOT / "tests/fixtures/levels.yaml"),
        "level1/2_",
        "--json",
        cwd=tmp_path,
    )
    assert sweep.returncode == 0, sweep.stderr
    assert json_records(sweep.stdout)["level1/2_relu_scale"]["outcome"] == "pass"


def test_task_keys_tell_apart_constructor_arguments_and_sources():
    """Two problems with the same inputs may convolve with other strides (KernelBench's
    level1/62 and 80 both take 8x32x32x32): their keys differ, and so do two sources."""
    levels = ROOT / "tests" / "fixtures" / "levels.yaml"
    entry = next(e for e in catalog.load([levels]) if e.name == "level1/4_conv2d")
    other = type(entry)(**{f: getattr(entry, f) for f in entry.__struct_fields__})
    strided = type(entry)(
        **{**{f: getattr(entry, f) for f in entry.__struct_fields__}, "init_args": [3, 4, 5]}
    )

    def key(e, source="x"):
        return tuned.task_key(
            e, "d.yaml", [], source, arch="x86_64", features=[], cpu="c", threads=1
        )

    assert key(entry) == key(other)
    assert key(entry).hash() != key(strided).hash()
    assert key(entry).hash() != key(entry, "y").hash()


def test_a_schedules_hash_is_the_same_in_any_checkout_and_changes_with_a_script(tmp_path):
    """The repository's tuned configurations are keyed by their schedule's stages: the same
    schedules folder copied elsewhere (another clone) hashes alike; a script's change does
    not."""
    copy = tmp_path / "schedules"
    shutil.copytree(SCHEDULES, copy)
    relative = Path("x86_64") / "conv2d" / "f32.yaml"

    def stages_hash(root):
        return tuned.stages_hash(
            descriptor.resolve_pipeline([str(root / relative)], schedules_dir=root, cwd=root)
        )

    assert stages_hash(copy) == stages_hash(SCHEDULES)
    script = copy / "x86_64" / "transforms" / "conv2d.mlir"
    script.write_text(script.read_text() + "\n// changed\n")
    assert stages_hash(copy) != stages_hash(SCHEDULES)


def _git(folder: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(folder), "-c", "user.name=kbd", "-c", "user.email=kbd@test", *args],
        check=True,
        capture_output=True,
    )


def test_rekey_carries_the_tuned_records_across_a_lowering_change_and_leaves_strangers(tmp_path):
    """After a pass joins the shared lowering, `--rekey REV`'s work gives each record whose hash
    was its descriptor's at REV the hash it has now (so the finder applies it again), leaves a
    record whose hash matched nothing as it was, and does nothing when run again."""
    from kbd.tune import rekey

    repository = tmp_path / "repo"
    schedules = repository / "schedules"
    shutil.copytree(SCHEDULES, schedules)
    records = tuned.read_jsonl(SCHEDULES / tuned.REPOSITORY_FILE)[:3]
    stranger = msgspec.structs.replace(
        records[2], key=msgspec.structs.replace(records[2].key, schedule_hash="0" * 16)
    )
    (schedules / tuned.REPOSITORY_FILE).write_text(tuned.jsonl([*records[:2], stranger]))
    _git(repository, "init", "-q")
    _git(repository, "add", ".")
    _git(repository, "commit", "-q", "-m", "schedules")
    lowering = schedules / "x86_64" / "cpu-lowering.yaml"
    lowering.write_text(lowering.read_text().replace("Pipeline:\n", "Pipeline:\n  - pass: cse\n"))

    def now(record: tuned.Tuned) -> str:
        path = schedules / record.key.descriptor
        stages = descriptor.resolve_pipeline([str(path)], schedules_dir=schedules, cwd=schedules)
        return tuned.stages_hash(stages)

    assert all(now(r) != r.key.schedule_hash for r in records)  # the change orphaned them
    path, result = rekey.rekey_repository_file("HEAD", schedules)
    assert path == schedules / tuned.REPOSITORY_FILE
    assert (len(result.rekeyed), result.unmatched, result.missing) == (2, [stranger.kernel], [])
    after = tuned.read_jsonl(path)
    assert [r.key.schedule_hash for r in after[:2]] == [now(r) for r in records[:2]]
    assert [r.config for r in after] == [r.config for r in records]
    assert after[2] == stranger
    _, again = rekey.rekey_repository_file("HEAD", schedules)
    assert (len(again.rekeyed), len(again.current)) == (0, 2)
    with pytest.raises(InputError, match="--rekey nosuch: not a revision of"):
        rekey.rekey_repository_file("nosuch", schedules)


def test_rekey_is_one_of_export_import_and_rekey(tmp_path):
    result = kbd("tune", "--rekey", "HEAD", "--export", "x.jsonl", cwd=tmp_path)
    assert result.returncode == 2
    assert "--export and --rekey: one at a time" in result.stderr
