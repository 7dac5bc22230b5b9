"""Re-keying tuned configurations across a change to the schedules.

A tuned configuration applies only while its task key's schedule hash is the hash of its
descriptor's default stages (kbd.plan.tuned). Any change to a file those stages include (a pass
added to cpu-lowering.yaml, a transform script edited) changes the hash, and every record of that
descriptor silently stops applying. When the change leaves the tuned parameters' meaning intact,
the records can be carried over: each record whose hash is its descriptor's at the old revision
gets the hash its descriptor has now. Records whose hash matched nothing at that revision are
left as they are and reported. Pure Python and torch-free.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

import msgspec

from kbd.plan import descriptor, tuned
from kbd.shared.errors import InputError


class Rekeyed(msgspec.Struct, frozen=True, kw_only=True):
    """What re-keying did to each record of a file."""

    records: list[tuned.Tuned]  # every record, re-keyed where it matched
    rekeyed: list[str]  # descriptors of the records that got a new hash
    current: list[str]  # already keyed by the stages now
    unmatched: list[str]  # kernels whose hash was neither the old nor the current one
    missing: list[str]  # descriptors that no longer exist (or no longer resolve)


def rekey(records: list[tuned.Tuned], old_schedules: Path, new_schedules: Path) -> Rekeyed:
    """Re-key `records` from the stages of `old_schedules` to those of `new_schedules` (two
    schedules/ folders, e.g. a git revision's and the working tree's)."""
    old_hashes: dict[str, str | None] = {}
    new_hashes: dict[str, str | None] = {}
    out, rekeyed, current, unmatched, missing = [], [], [], [], []
    for record in records:
        name = record.key.descriptor
        old = _hash(old_hashes, old_schedules, name)
        new = _hash(new_hashes, new_schedules, name)
        if new is None:
            missing.append(name)
        elif record.key.schedule_hash == new:
            current.append(name)
        elif old is not None and record.key.schedule_hash == old:
            key = msgspec.structs.replace(record.key, schedule_hash=new)
            record = msgspec.structs.replace(record, key=key)
            rekeyed.append(name)
        else:
            unmatched.append(record.kernel)
        out.append(record)
    return Rekeyed(
        records=out, rekeyed=rekeyed, current=current, unmatched=unmatched, missing=missing
    )


def _hash(cache: dict[str, str | None], schedules: Path, name: str) -> str | None:
    """The stages hash of descriptor `name` (relative to `schedules`), None when it is not
    there or does not resolve."""
    if name not in cache:
        path = schedules / name
        if Path(name).is_absolute() or not path.is_file():
            cache[name] = None
        else:
            try:
                stages = descriptor.resolve_pipeline(
                    [str(path)], schedules_dir=schedules, cwd=schedules
                )
            except InputError:
                cache[name] = None
            else:
                cache[name] = tuned.stages_hash(stages)
    return cache[name]


def schedules_at(revision: str, repository: Path, into: Path) -> Path:
    """Extract the schedules/ folder of `repository` at git `revision` under `into`."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(repository), "archive", "--format=tar", revision, "schedules"],
            capture_output=True,
            check=False,
        )
    except OSError as exc:
        raise InputError(f"--rekey {revision}: cannot run git ({exc})") from None
    if archive.returncode != 0:
        reason = archive.stderr.decode(errors="replace").strip().splitlines()
        raise InputError(
            f"--rekey {revision}: not a revision of {repository} with a schedules/ folder "
            f"(git: {reason[-1] if reason else 'failed'})"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "schedules"


def rekey_repository_file(revision: str, schedules: Path) -> tuple[Path, Rekeyed]:
    """Re-key `schedules`/tuned.jsonl in place from the stages at git `revision` to the
    working tree's."""
    path = schedules / tuned.REPOSITORY_FILE
    records = tuned.read_jsonl(path)
    with tempfile.TemporaryDirectory(prefix="kbd-rekey-") as scratch:
        old = schedules_at(revision, schedules.parent, Path(scratch))
        result = rekey(records, old, schedules)
    if result.rekeyed:
        staged = path.with_name(path.name + ".rekey")
        staged.write_text(tuned.jsonl(result.records))
        os.replace(staged, path)
    return path, result
