"""The FS tier's limit as storage engineers measure it: fio (Debian's ``fio``) reading the
prefix's own L2 files with O_DIRECT, one read of the adapter's size (a whole object: the FS
adapter reads each object in one ``preadv``, lmcache_ext/adapters/fileio.py ``preadv_full``),
each file in turn, at queue depths 1-32 on the libaio and io_uring engines (one job per
object size, all at once, as a restore reads every group's objects). A pass is fio's own
runtime over the bytes it read; the best mode is this disk's limit."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from bsrctl.stack.storage import StorageStack

from .common import Sample

ENGINES = ("libaio", "io_uring")
DEPTHS = (1, 2, 4, 8, 16, 32)
ALIGN = 4096  # O_DIRECT: the block size a multiple of the logical block
FIO_TIMEOUT_S = 600.0


def fio_binary() -> str | None:
    return shutil.which("fio")


def size_classes(paths: Sequence[Path]) -> dict[int, list[Path]]:
    """Files by the adapter's read for them: the object's size rounded down to ``ALIGN``
    (a registration with several object groups has several sizes)."""
    out: dict[int, list[Path]] = {}
    for p in paths:
        size = p.stat().st_size
        bs = size - size % ALIGN
        if bs <= 0:
            raise ValueError(f"fio: an object of {size} B is below one {ALIGN} B block ({p})")
        out.setdefault(bs, []).append(p)
    return dict(sorted(out.items()))


def link_files(paths: Sequence[Path], where: Path) -> list[Path]:
    """Short names for the objects (``where/<i>``, symlinks): fio's file list is one option
    value, and the L2's own names (key strings, hundreds of them) overflow it."""
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for i, p in enumerate(paths):
        link = where / str(i)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(p)
        out.append(link)
    return out


def job_text(classes: dict[int, list[Path]], engine: str, depth: int) -> str:
    """One job per size class, all at once (a restore reads every group's objects), each
    reading its files whole in turn at ``depth``; reported as one group."""
    lines = ["[global]", "direct=1", "rw=read", f"ioengine={engine}", f"iodepth={depth}",
             "thread", "file_service_type=sequential", "group_reporting"]  # fmt: skip
    for bs, files in classes.items():
        names = ":".join(str(f).replace(":", "\\:") for f in files)
        lines += [f"[objects-{bs}]", f"bs={bs}", f"filename={names}"]
    return "\n".join(lines) + "\n"


def fio_argv(fio: str, job_file: Path) -> list[str]:
    return [fio, "--readonly", "--output-format=json", str(job_file)]


def parse(out: str) -> Sample:
    """fio's JSON: the job's read runtime (ms) and bytes; an error code is an error."""
    doc = json.loads(out[out.index("{") :])  # fio may print notes before the JSON
    (job,) = doc["jobs"]
    if job.get("error"):
        raise RuntimeError(f"fio: job error {job['error']}")
    read = job["read"]
    if read["runtime"] <= 0 or read["io_bytes"] <= 0:
        raise RuntimeError(f"fio: read {read['io_bytes']} B in {read['runtime']} ms")
    return Sample(read["runtime"] / 1000.0, int(read["io_bytes"]))


def run_fio(argv: list[str]) -> Sample:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=FIO_TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise RuntimeError(f"fio exit {proc.returncode}: {' '.join(tail)[:300]}")
    return parse(proc.stdout)


class FioJobs:
    """The objects' links and one job file per (engine, depth) under ``where``."""

    def __init__(self, fio: str, paths: Sequence[Path], where: Path) -> None:
        self.fio, self.where = fio, where
        self.classes = size_classes(link_files(paths, where / "links"))

    def argv(self, engine: str, depth: int, classes: dict[int, list[Path]] | None = None):
        job = self.where / f"{engine}-qd{depth}.fio"
        job.write_text(job_text(classes or self.classes, engine, depth))
        return fio_argv(self.fio, job)

    def usable(self) -> dict[str, str | None]:
        """Each engine: None when one read of one object works, else why not (io_uring can
        be off in a sandbox's kernel)."""
        bs, files = next(iter(self.classes.items()))
        out: dict[str, str | None] = {}
        for engine in ENGINES:
            try:
                run_fio(self.argv(engine, 1, {bs: files[:1]}))
                out[engine] = None
            except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
                out[engine] = str(e)
        return out


def fio_mode(stack: StorageStack, jobs: FioJobs, engine: str, depth: int) -> Callable[[], Sample]:
    argv = jobs.argv(engine, depth)

    def go() -> Sample:
        stack.drop_page_cache()
        return run_fio(argv)

    return go


def label(engine: str, depth: int) -> str:
    return f"fio O_DIRECT {engine} iodepth={depth}"


__all__ = ["DEPTHS", "ENGINES", "FioJobs", "fio_binary", "fio_mode", "job_text", "label",
           "link_files", "parse", "size_classes"]  # fmt: skip
