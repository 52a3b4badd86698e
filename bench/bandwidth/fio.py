"""The FS tier's limit as storage engineers measure it: fio (Debian's ``fio``) reading the
prefix's own L2 files with O_DIRECT, one read of the adapter's size (a whole object: the FS
adapter reads each object in one ``preadv``, lmcache_ext/adapters/fileio.py ``preadv_full``),
each file in turn, at queue depths 1-32 on the libaio and io_uring engines. A pass is fio's
own job runtime over the bytes it read; the best mode is this disk's limit."""

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


def block_size(paths: Sequence[Path]) -> int:
    """The adapter's read: one object, the smallest file rounded down to ``ALIGN``."""
    smallest = min(p.stat().st_size for p in paths)
    bs = smallest - smallest % ALIGN
    if bs <= 0:
        raise ValueError(f"fio: objects of {smallest} B are below one {ALIGN} B block")
    return bs


def fio_argv(fio: str, paths: Sequence[Path], bs: int, engine: str, depth: int) -> list[str]:
    """One job reading every file whole, in order (``file_service_type=sequential``)."""
    names = ":".join(str(p).replace(":", "\\:") for p in paths)  # fio's file list separator
    return [
        fio, "--name=bsrctl-fs-limit", "--readonly", "--direct=1", "--rw=read", f"--bs={bs}",
        f"--ioengine={engine}", f"--iodepth={depth}", "--numjobs=1", "--thread",
        "--file_service_type=sequential", f"--filename={names}", "--output-format=json",
    ]  # fmt: skip


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
        raise RuntimeError(f"fio exit {proc.returncode}: {' '.join(tail)}")
    return parse(proc.stdout)


def usable_engines(fio: str, paths: Sequence[Path], bs: int) -> dict[str, str | None]:
    """Each engine: None when one read of the first file works, else why not (io_uring can
    be off in a sandbox's kernel)."""
    out: dict[str, str | None] = {}
    for engine in ENGINES:
        try:
            run_fio(fio_argv(fio, paths[:1], bs, engine, 1))
            out[engine] = None
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            out[engine] = str(e)
    return out


def fio_mode(
    stack: StorageStack, fio: str, paths: list[Path], bs: int, engine: str, depth: int
) -> Callable[[], Sample]:
    argv = fio_argv(fio, paths, bs, engine, depth)

    def go() -> Sample:
        stack.drop_page_cache()
        return run_fio(argv)

    return go


def label(engine: str, depth: int) -> str:
    return f"fio O_DIRECT {engine} iodepth={depth}"


__all__ = ["DEPTHS", "ENGINES", "block_size", "fio_argv", "fio_binary", "fio_mode", "label",
           "parse", "usable_engines"]  # fmt: skip
