"""Which /dev/shm segments a run holds, on record outside the run, so that a run killed by
SIGKILL (no teardown, no finally) does not leak its L1 pool until reboot.

A stack names its segments here as it creates them (the storage stack its L1 pools, before
LMCache creates them; the serving stack what its processes map once they are up), with the
processes that own them (PID and start time, so a reused PID is not mistaken for the owner).
A clean teardown releases the record. The next bsrctl run and ``bsrctl doctor`` call
``reclaim()``: a segment is removed only when every owner is gone, it is one its record
names, and no process maps it or holds it open. Nothing else in /dev/shm is ever touched.

Records live in ``$BSRCTL_SHM_LEDGER`` (default ``<tmp>/bsrctl-shm-<uid>``), one JSON file
per stack deployment, written atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bsrkv.atomic import write_atomic

LEDGER_ENV = "BSRCTL_SHM_LEDGER"
SHM = Path("/dev/shm")


def ledger_dir() -> Path:
    default = Path(tempfile.gettempdir()) / f"bsrctl-shm-{os.getuid()}"
    return Path(os.environ.get(LEDGER_ENV) or default)


@dataclass(frozen=True)
class Reclaimed:
    """One segment removed: its name, its size, the run folder whose stack named it."""

    name: str
    bytes: int
    run_dir: str


def _start_time(pid: int) -> float | None:
    """The process's start time; None when it is gone (a zombie counts as gone)."""
    try:
        p = psutil.Process(pid)
        return None if p.status() == psutil.STATUS_ZOMBIE else p.create_time()
    except psutil.Error:
        return None


def record(key: str, segments: Iterable[str], owners: Sequence[int], run_dir: Path) -> Path:
    """Name `segments` (bare names under /dev/shm) as held by `owners` (PIDs alive now) for
    the stack deployment `key`. Recording again under the same key replaces the record."""
    times = {str(p): t for p in owners if (t := _start_time(p)) is not None}
    doc = {
        "key": key,
        "run_dir": str(run_dir),
        "owners": times,
        "segments": sorted(set(segments)),
    }
    path = ledger_dir() / f"{key}.json"
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode())
    return path


def release(key: str) -> None:
    """A clean teardown: the stack freed its segments itself; drop the record."""
    (ledger_dir() / f"{key}.json").unlink(missing_ok=True)


def segments_in_use() -> set[str]:
    """Names under /dev/shm that any process maps or holds open (one pass over /proc)."""
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for line in (proc / "maps").read_text().splitlines():
                at = line.find("/dev/shm/")
                if at >= 0:
                    used.add(line[at + 9 :].removesuffix(" (deleted)"))
        except OSError:
            pass
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("/dev/shm/"):
                used.add(target[9:].removesuffix(" (deleted)"))
    return used


def segments_of(pids: Iterable[int]) -> set[str]:
    """The /dev/shm names these processes map or hold open now."""
    out: set[str] = set()
    for pid in pids:
        proc = Path(f"/proc/{pid}")
        try:
            for line in (proc / "maps").read_text().splitlines():
                at = line.find("/dev/shm/")
                if at >= 0 and not line.endswith(" (deleted)"):
                    out.add(line[at + 9 :])
            for fd in (proc / "fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("/dev/shm/") and not target.endswith(" (deleted)"):
                    out.add(target[9:])
        except OSError:
            continue
    return out


def _owners_alive(owners: dict[str, float]) -> bool:
    return any(_start_time(int(pid)) == t for pid, t in owners.items())


def reclaim() -> list[Reclaimed]:
    """Remove the segments of dead stacks that nothing maps; returns what was removed. A
    record whose owners live is kept; one whose segments are still in use keeps those."""
    folder = ledger_dir()
    if not folder.is_dir():
        return []
    removed: list[Reclaimed] = []
    used: set[str] | None = None
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            owners, names = dict(doc["owners"]), list(doc["segments"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half a record is no licence to remove anything
        if _owners_alive(owners):
            continue
        present = [n for n in names if "/" not in n and (SHM / n).exists()]
        if present and used is None:
            used = segments_in_use()
        left = [n for n in present if used is not None and n in used]
        for name in present:
            if name in left:
                continue
            seg = SHM / name
            try:
                size = seg.stat().st_size
                seg.unlink()
            except FileNotFoundError:
                continue
            removed.append(Reclaimed(name, size, str(doc.get("run_dir", ""))))
        if left:
            write_atomic(path, (json.dumps({**doc, "segments": left}, indent=1) + "\n").encode())
        else:
            path.unlink(missing_ok=True)
    return removed
