"""The import cache: content addresses, verified entries, eviction."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from kbd.caches import import_cache
from kbd.shared.protocol import ImportCache, Job, Limits, Sized, Tensor
from kbd.shared.shapes import Shape
from tests.conftest import ROOT

MODULE = "module {\n  func.func @main() {\n    return\n  }\n}\n"


def _job(**changes) -> Job:
    job = Job(
        kernel="level1/k.py",
        source="/kb/level1/k.py",
        source_text="class Model: ...\n",
        inputs=None,
        init_args=None,
        outputs=None,
        dtype="f32",
        stages=[],
        seed=0,
        tolerance=0.01,
        max_tolerance=1.0,
        opt_level=3,
        limits=Limits(),
    )
    return msgspec.structs.replace(job, **changes)


def _cache(tmp_path: Path, key: str = "ab" * 32, max_bytes: int = 1 << 20) -> ImportCache:
    return ImportCache(key=key, directory=str(tmp_path / "cache"), max_bytes=max_bytes)


def test_key_follows_what_the_import_depends_on():
    base = import_cache.key(_job())
    assert import_cache.key(_job()) == base
    assert import_cache.key(_job(dtype="f64")) != base
    assert import_cache.key(_job(seed=1)) != base
    assert import_cache.key(_job(init_args=[3])) != base
    # pipelines, tolerances and limits come after the import: same entry
    assert import_cache.key(_job(opt_level=0, tolerance=0.1)) == base
    assert import_cache.key(_job(source_text="class Model: pass\n")) != base
    assert import_cache.key(_job(source="/elsewhere/k.py")) == base  # content, not place


def test_runs_at_other_shapes_never_share_an_entry():
    """The levels entry's input shapes are in the key; at a problem's own shapes (no input
    specs: `--shapes kernelbench`) the shapes sizing found are."""

    def levels(*dims) -> Job:
        return _job(inputs=[Tensor(Shape(d, "f32", "rnd")) for d in dims])

    def own(*inputs) -> Job:
        sized = Sized(list(inputs), [0] * len(inputs), None, 0, None)
        return _job(shapes="kernelbench", sized=sized)

    assert import_cache.key(levels((8, 8))) != import_cache.key(levels((32, 48)))
    assert import_cache.key(levels((8, 8))) != import_cache.key(levels((8, 8), (8, 8)))
    assert import_cache.key(own("8x8xf32")) != import_cache.key(own("32x48xf32"))
    assert import_cache.key(own("8x8xf32")) != import_cache.key(_job())  # unsized: not a key
    assert import_cache.key(own("8x8xf32")) == import_cache.key(own("8x8xf32"))


def test_entry_round_trips(tmp_path):
    cache = _cache(tmp_path)
    assert import_cache.lookup(cache) is None
    import_cache.store(cache, MODULE)
    assert import_cache.lookup(cache) == MODULE


def test_corrupt_or_truncated_entries_are_removed_never_used(tmp_path):
    cache = _cache(tmp_path)
    path = Path(cache.directory) / cache.key[:2] / f"{cache.key}.mlir"
    for damage in (
        lambda data: data[:-5],  # truncated
        lambda data: data.replace(b"return", b"retvrn"),  # flipped bytes, same size
        lambda data: data.split(b"\n", 1)[1],  # header lost
        lambda data: b"",
    ):
        import_cache.store(cache, MODULE)
        path.write_bytes(damage(path.read_bytes()))
        assert import_cache.lookup(cache) is None
        assert not path.exists()


def test_least_recently_used_entries_are_evicted(tmp_path):
    size = len(MODULE) + 120  # body plus header
    caches = [_cache(tmp_path, key=f"{i:02d}" * 32, max_bytes=3 * size) for i in range(4)]
    for age, cache in enumerate(caches[:3]):
        import_cache.store(cache, MODULE)
        path = Path(cache.directory) / cache.key[:2] / f"{cache.key}.mlir"
        os.utime(path, (1000 + age, 1000 + age))
    assert import_cache.lookup(caches[0]) == MODULE  # used now: the newest
    import_cache.store(caches[3], MODULE)
    present = [import_cache.lookup(c) is not None for c in caches]
    assert present == [True, False, True, True]


# Real runs that hit, rebuild and bypass the import cache: tests/test_compile_cache.py (one
# sequence of runs for both caches).


def test_the_key_covers_every_module_the_import_applies():
    """What kbd.worker.mlir.importer imports of kbd's shapes every imported module: a change
    there must change every key, or the cache serves modules of the old code."""
    import ast

    from kbd.caches.import_cache import _INGRESS_CODE

    importer = ROOT / "kbd" / "worker" / "mlir" / "importer.py"
    used = set()
    for node in ast.walk(ast.parse(importer.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "kbd.worker":
            used |= {f"worker/{alias.name}.py" for alias in node.names}
    assert used and used <= set(_INGRESS_CODE)
