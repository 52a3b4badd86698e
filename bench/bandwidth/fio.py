"""The FS tier's limit as storage engineers measure it: fio (Debian's ``fio``) reading the
prefix's own L2 files with O_DIRECT, one read of the adapter's size (a whole object: the FS
adapter reads each object in one ``preadv``, lmcache_ext/adapters/fileio.py ``preadv_full``),
each file in turn, at queue depths 1-32 on the libaio and io_uring engines (one job per
object size, all at once, as a restore reads every group's objects). A pass is fio's own
runtime over the bytes it read; the best mode is this disk's limit.

A job names its files by directory (``opendir``: one directory of hard links per object
size): fio refuses an option value over 4096 characters, and a 64K-token prefix's 512
objects per size listed in ``filename=`` dropped the job. A fio failure is ``ModeFailed``
naming the job and fio's own message; the bench drops that mode and goes on."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from bsrctl.stack.storage import StorageStack

from .common import ModeFailed, Sample

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


def link_classes(classes: dict[int, list[Path]], where: Path) -> dict[int, Path]:
    """One directory per size class (``where/objects-<bs>``) holding a hard link to each
    of its objects (``opendir`` reads regular files only, not symlinks; the links live on
    the L2's own file system, beside it)."""
    out = {}
    for bs, files in classes.items():
        d = where / f"objects-{bs}"
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        for i, p in enumerate(files):
            (d / str(i)).hardlink_to(p)
        out[bs] = d
    return out


def job_text(dirs: dict[int, Path], engine: str, depth: int) -> str:
    """One job per size class, all at once (a restore reads every group's objects), each
    reading the files of its directory whole in turn at ``depth``; reported as one group."""
    lines = ["[global]", "direct=1", "rw=read", f"ioengine={engine}", f"iodepth={depth}",
             "thread", "file_service_type=sequential", "group_reporting"]  # fmt: skip
    for bs, d in dirs.items():
        lines += [f"[objects-{bs}]", f"bs={bs}", f"opendir={d}"]
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
    """One fio run; ``ModeFailed`` with fio's own words when it fails or times out."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=FIO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModeFailed(f"fio {argv[-1]}: no answer in {FIO_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        said = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        job = next((ln for ln in said if " job " in ln), "")  # "fio: job objects-N dropped"
        why = next((ln for ln in said if ln != job), "")
        raise ModeFailed(f"fio exit {proc.returncode}: {job} {why}".strip()[:300])
    try:
        return parse(proc.stdout)
    except (RuntimeError, ValueError, KeyError) as e:
        raise ModeFailed(f"fio {argv[-1]}: {e}") from None


class FioJobs:
    """The objects' links and one job file per (engine, depth) under ``where``."""

    def __init__(self, fio: str, paths: Sequence[Path], where: Path) -> None:
        self.fio, self.where = fio, where
        self.classes = size_classes(paths)
        self.dirs = link_classes(self.classes, where / "links")

    def argv(self, engine: str, depth: int, dirs: dict[int, Path] | None = None) -> list[str]:
        job = self.where / f"{engine}-qd{depth}.fio"
        job.write_text(job_text(dirs or self.dirs, engine, depth))
        return fio_argv(self.fio, job)

    def usable(self) -> dict[str, str | None]:
        """Each engine: None when one read of one object works, else why not (io_uring can
        be off in a sandbox's kernel)."""
        bs, files = next(iter(self.classes.items()))
        one = link_classes({bs: files[:1]}, self.where / "probe")
        out: dict[str, str | None] = {}
        for engine in ENGINES:
            try:
                run_fio(self.argv(engine, 1, one))
                out[engine] = None
            except ModeFailed as e:
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
           "link_classes", "parse", "size_classes"]  # fmt: skip
