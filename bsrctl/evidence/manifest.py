"""manifest.json: the sha256 of every file of a run folder, so `bsrctl verify` can name each
file that changed, appeared or vanished since.

Written after every point and when the run ends (atomically), and extended by `bsrctl
report` with the files it renders. Scratch data a stack keeps under the run folder while it
runs (L2 tier files, the mmap destination, vLLM's compile cache) is not part of the record:
it is removed at cleanup or rebuilt, and can be gigabytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsrkv.atomic import write_atomic

NAME = "manifest.json"
SCHEMA = "bsrctl.manifest/1"
SCRATCH_DIRS = frozenset({"l2-fs", "storage", "dest", "vllm-cache", "checksums-fs"})


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(run_dir: Path) -> list[Path]:
    out = []
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if SCRATCH_DIRS & set(rel.parts[:-1]) or not path.is_file() or path.is_symlink():
            continue
        if rel.as_posix() == NAME or (path.name.startswith(".") and path.name.endswith(".tmp")):
            continue  # the manifest itself; an atomic write's temp file
        out.append(path)
    return out


def _entry(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def write_manifest(run_dir: Path) -> Path:
    """Record every file of the run folder now."""
    run_dir = Path(run_dir)
    files = {p.relative_to(run_dir).as_posix(): _entry(p) for p in _files(run_dir)}
    return _write(run_dir, files)


def add_to_manifest(run_dir: Path, paths: Iterable[Path]) -> Path:
    """Record these files (rendered after the run) and leave every other entry as it was,
    so a file changed since the run still fails verify."""
    run_dir = Path(run_dir)
    doc = _read(run_dir) or {"files": {}}
    files = dict(doc["files"])
    for p in paths:
        p = Path(p)
        files[p.resolve().relative_to(run_dir.resolve()).as_posix()] = _entry(p)
    return _write(run_dir, files)


def _write(run_dir: Path, files: dict[str, dict[str, Any]]) -> Path:
    doc = {"schema": SCHEMA, "files": dict(sorted(files.items()))}
    path = run_dir / NAME
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    return path


def _read(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / NAME
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r} is not {SCHEMA!r}")
    return dict(doc)


@dataclass(frozen=True)
class Verification:
    """What differs from the manifest: files changed, appeared and vanished."""

    checked: int
    changed: list[str] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.changed or self.appeared or self.vanished)


def verify(run_dir: Path) -> Verification:
    """Recompute every sum; FileNotFoundError when the folder has no manifest."""
    run_dir = Path(run_dir)
    doc = _read(run_dir)
    if doc is None:
        raise FileNotFoundError(f"{run_dir / NAME}")
    recorded: dict[str, dict[str, Any]] = doc["files"]
    present = {p.relative_to(run_dir).as_posix(): p for p in _files(run_dir)}
    changed = [
        rel
        for rel, entry in recorded.items()
        if rel in present and sha256_file(present[rel]) != entry["sha256"]
    ]
    return Verification(
        checked=len(recorded),
        changed=sorted(changed),
        appeared=sorted(set(present) - set(recorded)),
        vanished=sorted(set(recorded) - set(present)),
    )
