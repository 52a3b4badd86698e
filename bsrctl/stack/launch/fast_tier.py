"""A memory-semantic flash tier on one machine (``serving.fast_tier``).

LMCache's L1 is a Device-DAX arena (``--l1-devdax-path``): here a loop device over a
pre-sized file the run creates (``losetup --direct-io=on``, so the loop's reads bypass the
host's page cache of that file). Its page cache is the fast tier; the device is the flash:

- the LMCache server runs in a child cgroup v1 ``memory`` cgroup made here (removed by
  path at the end) whose limit is the server's measured base plus the fast tier's size, so
  at most that much of the arena stays resident;
- its reads of the arena's device are throttled two ways, in a child ``blkio`` cgroup:
  bytes per second (``blkio.throttle.read_bps_device``, the flash's bandwidth, which bounds
  large reads) and requests per second (``read_iops_device``, its demand-miss rate, which
  bounds 4 KiB faults); ``set_demand`` changes the second between cells;
- readahead is off for the arena: ``read_ahead_kb`` 0 of the loop device this run created
  (LMCache's own mapping cannot be madvised from outside), so a fault loads its page only;
- "clear the fast tier" drops the arena's page cache only: the server's mapping paged out
  (``process_madvise(MADV_PAGEOUT)`` of its arena range) and the device's cache dropped
  (``posix_fadvise(DONTNEED)``), after a flush (dirty pages are never dropped). Never
  ``drop_caches``.

Where the cgroup controllers, the throttle or the loop device cannot be set this is a
``StackFailed`` (exit 3) naming which: never a run without them. ``SysRoots`` points at
``/sys`` and ``/proc``; tests inject another root."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed

MIB = 1 << 20
PAGE = mmap.PAGESIZE
_SYS_PIDFD_OPEN = 434  # x86_64 and arm64 alike (the generic syscall table)
_SYS_PROCESS_MADVISE = 440
_MADV_PAGEOUT = 21
# Clearing passes over the arena and the pause between them (see FastTier.clear).
CLEAR_PASSES = 5
CLEAR_PAUSE_S = 0.2
STAT_KEYS = ("cache", "rss", "shmem", "mapped_file", "active_file", "inactive_file",
             "unevictable", "dirty", "writeback", "pgmajfault", "total_cache", "total_rss",
             "total_mapped_file")  # fmt: skip


@dataclass(frozen=True)
class FastTierConfig:
    """The tier as a launch needs it (from the spec's ``serving.fast_tier``)."""

    arena_bytes: int  # the device's exposed memory: LMCache's whole L1
    fast_tier_bytes: int  # its DRAM: page cache the server's cgroup may keep beyond its base
    flash_bytes_s: int  # reads of the arena's device, throttled: bandwidth (large reads)
    demand_iops: int = 0  # its requests per second (4 KiB faults); 0: not capped


@dataclass(frozen=True)
class SysRoots:
    cgroup: Path = Path("/sys/fs/cgroup")
    block: Path = Path("/sys/block")
    self_cgroup: Path = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class LoopDevice:
    path: str  # /dev/loopN: the arena LMCache maps
    name: str  # loopN, under /sys/block
    dev: tuple[int, int]  # major, minor


def attach_loop(backing: Path) -> LoopDevice:
    """A loop device over ``backing`` with direct I/O (its reads skip the host page cache)."""
    try:
        out = subprocess.run(
            ["losetup", "--find", "--show", "--direct-io=on", str(backing)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        raise StackFailed(f"fast tier: no loop device over {backing} (losetup: {e})") from None
    path = out.stdout.strip()
    st = os.stat(path)
    return LoopDevice(path, os.path.basename(path), (os.major(st.st_rdev), os.minor(st.st_rdev)))


def detach_loop(dev: LoopDevice) -> None:
    subprocess.run(["losetup", "-d", dev.path], capture_output=True, timeout=30, check=False)


def own_cgroup(roots: SysRoots, controller: str) -> str:
    """This process's cgroup v1 path for ``controller`` (``/proc/self/cgroup``)."""
    for line in roots.self_cgroup.read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    raise StackFailed(
        f"fast tier: no cgroup v1 {controller} controller for this process "
        f"({roots.self_cgroup}); the flash tier needs it (memory: the fast tier's size, "
        f"blkio: the flash rate)"
    )


def _write(path: Path, value: str, what: str) -> None:
    try:
        path.write_text(value)
    except OSError as e:
        raise StackFailed(f"fast tier: cannot set {what} ({path}: {e.strerror})") from None


@dataclass
class Cgroups:
    """The server's child ``memory`` and ``blkio`` cgroups, made under this process's own
    and removed by path."""

    memory: Path
    blkio: Path

    @classmethod
    def create(cls, roots: SysRoots, name: str) -> Cgroups:
        made: list[Path] = []
        try:
            for controller in ("memory", "blkio"):
                mount = roots.cgroup / controller
                if not (mount / "cgroup.procs").is_file():
                    raise StackFailed(
                        f"fast tier: the cgroup v1 {controller} controller is not mounted at "
                        f"{mount}; cannot run the flash tier without it"
                    )
                path = mount / own_cgroup(roots, controller).lstrip("/") / name
                try:
                    path.mkdir()
                except OSError as e:
                    raise StackFailed(
                        f"fast tier: cannot create the {controller} cgroup {path}: {e.strerror}"
                    ) from None
                made.append(path)
        except BaseException:
            for p in reversed(made):
                _rmdir(p)
            raise
        return cls(*made)

    def set_limit(self, limit_bytes: int) -> None:
        _write(self.memory / "memory.limit_in_bytes", str(limit_bytes), "memory.limit_in_bytes")
        got = int((self.memory / "memory.limit_in_bytes").read_text())
        if got != limit_bytes:  # the kernel rounds to pages: the limit is page-aligned here
            raise StackFailed(f"fast tier: memory.limit_in_bytes reads {got}, set {limit_bytes}")

    def throttle(self, dev: tuple[int, int], value: int, rule: str = "read_bps_device") -> None:
        """A read throttle of the device (``read_bps_device`` bytes/s, ``read_iops_device``
        requests/s); 0 removes the rule (the kernel's way of clearing one)."""
        line, path = f"{dev[0]}:{dev[1]} {value}", self.blkio / f"blkio.throttle.{rule}"
        _write(path, line, f"blkio.throttle.{rule}")
        if value and line not in path.read_text().splitlines():
            raise StackFailed(f"fast tier: {path} does not hold {line!r} after writing it")

    def procs_files(self) -> tuple[str, str]:
        return str(self.memory / "cgroup.procs"), str(self.blkio / "cgroup.procs")

    def pids(self) -> list[int]:
        return [int(x) for x in (self.memory / "cgroup.procs").read_text().split()]

    def usage_bytes(self) -> int:
        return int((self.memory / "memory.usage_in_bytes").read_text())

    def counters(self, dev: tuple[int, int]) -> dict[str, Any]:
        m = self.memory
        stat = dict(line.split() for line in (m / "memory.stat").read_text().splitlines())
        maj_min = f"{dev[0]}:{dev[1]}"
        out: dict[str, Any] = {
            "memory_stat": {k: int(stat[k]) for k in STAT_KEYS if k in stat},
            "usage_bytes": int((m / "memory.usage_in_bytes").read_text()),
            "max_usage_bytes": int((m / "memory.max_usage_in_bytes").read_text()),
            "failcnt": int((m / "memory.failcnt").read_text()),
            "limit_bytes": int((m / "memory.limit_in_bytes").read_text()),
        }
        for name in ("io_service_bytes", "io_serviced"):
            path = self.blkio / f"blkio.throttle.{name}"
            rows = [ln.split() for ln in path.read_text().splitlines()]
            out[f"throttle_{name}"] = {r[1]: int(r[2]) for r in rows
                                       if len(r) == 3 and r[0] == maj_min}  # fmt: skip
        return out

    def remove(self, timeout_s: float = 10.0) -> list[str]:
        """rmdir both (a cgroup empties once its processes are gone); what stayed."""
        left = []
        for p in (self.memory, self.blkio):
            if not _rmdir(p, timeout_s):
                left.append(str(p))
        return left


def _rmdir(path: Path, timeout_s: float = 0.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


class _Libc:
    def __init__(self) -> None:
        self.c = ctypes.CDLL(None, use_errno=True)
        self.c.mmap.restype = ctypes.c_void_p
        self.c.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                ctypes.c_int, ctypes.c_long]  # fmt: skip
        self.c.syscall.restype = ctypes.c_long


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def resident_bytes(fd: int, size: int) -> int:
    """Bytes of the file's first ``size`` bytes in the page cache (mincore of a mapping
    never touched, so nothing is faulted in)."""
    libc = _Libc().c
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap for mincore")
    try:
        vec = (ctypes.c_ubyte * ((size + PAGE - 1) // PAGE))()
        if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(b & 1 for b in vec) * PAGE
    finally:
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))


def page_out(pid: int, ranges: Iterable[tuple[int, int]]) -> int:
    """``process_madvise(MADV_PAGEOUT)`` of ``pid``'s address ranges: its clean file pages
    there are reclaimed (mlocked and dirty ones stay). Bytes advised."""
    libc = _Libc().c
    pidfd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        raise OSError(ctypes.get_errno(), f"pidfd_open({pid})")
    try:
        done = 0
        for lo, hi in ranges:
            iov = _Iovec(lo, hi - lo)
            got = libc.syscall(_SYS_PROCESS_MADVISE, pidfd, ctypes.byref(iov), 1, _MADV_PAGEOUT, 0)
            if got < 0:
                raise OSError(ctypes.get_errno(), f"process_madvise(MADV_PAGEOUT) of {pid}")
            done += got
        return done
    finally:
        os.close(pidfd)


def mapped_ranges(pid: int, path: str, proc: Path = Path("/proc")) -> list[tuple[int, int]]:
    """``pid``'s mappings of ``path`` (its /proc maps)."""
    out = []
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == path:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


@dataclass
class FastTier:
    """The arena, its loop device and the server's cgroups, for one stack."""

    config: FastTierConfig
    stack_dir: Path
    roots: SysRoots = field(default_factory=SysRoots)
    attach: Callable[[Path], LoopDevice] = attach_loop
    detach: Callable[[LoopDevice], None] = detach_loop
    loop: LoopDevice | None = None
    cgroups: Cgroups | None = None
    base_bytes: int | None = None  # the server's measured base (its cgroup less the arena)
    limit_bytes: int | None = None
    demand_iops: int = 0  # the read_iops_device cap in force

    @property
    def backing(self) -> Path:
        return self.stack_dir / "arena.img"

    def up(self) -> None:
        """Arena file, loop device (readahead off), cgroups and throttle, or exit 3."""
        try:
            self.stack_dir.mkdir(parents=True, exist_ok=True)
            with open(self.backing, "wb") as f:
                f.truncate(self.config.arena_bytes)
            self.loop = self.attach(self.backing)
            ra = self.roots.block / self.loop.name / "queue" / "read_ahead_kb"
            _write(ra, "0", f"read_ahead_kb of {self.loop.path}")
            if ra.read_text().strip() != "0":
                raise StackFailed(f"fast tier: {ra} reads {ra.read_text().strip()!r}, not 0")
            name = f"bsrctl-{os.getpid()}-{self.loop.name}"
            self.cgroups = Cgroups.create(self.roots, name)
            self.cgroups.throttle(self.loop.dev, self.config.flash_bytes_s)
            if self.config.demand_iops:
                self.set_demand(self.config.demand_iops)
        except BaseException:
            self.down()
            raise

    def set_demand(self, iops: int) -> None:
        """The demand path's cap (read_iops_device), now; 0: none."""
        assert self.cgroups is not None and self.loop is not None, "fast tier not up"
        self.cgroups.throttle(self.loop.dev, iops, "read_iops_device")
        self.demand_iops = iops

    @property
    def arena_path(self) -> str:
        assert self.loop is not None, "fast tier not up"
        return self.loop.path

    def join_prefix(self) -> tuple[str, ...]:
        """The argv prefix that puts the launched process in both cgroups, then execs."""
        assert self.cgroups is not None, "fast tier not up"
        return (sys.executable, "-m", "bsrctl.stack.launch.cgroup_join",
                *self.cgroups.procs_files(), "--")  # fmt: skip

    def _fd(self) -> int:
        return os.open(self.arena_path, os.O_RDONLY)

    def flush(self) -> None:
        """Write back what the server stored into the arena (the flash copy)."""
        fd = os.open(self.arena_path, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def resident_bytes(self) -> int:
        fd = self._fd()
        try:
            return resident_bytes(fd, self.config.arena_bytes)
        finally:
            os.close(fd)

    def seal(self) -> dict[str, int]:
        """After seeding: flush, measure the server's base (its cgroup's usage less every
        file page it holds: the arena's and the libraries' it read, which the kernel may
        reclaim; what stays is its anonymous and shared memory), clear the tier, then limit
        the cgroup to base + fast tier: its file cache, the arena's almost all, fits in the
        fast tier."""
        assert self.cgroups is not None and self.loop is not None
        self.flush()
        resident = self.resident_bytes()
        got = self.cgroups.counters(self.loop.dev)
        stat, usage = got["memory_stat"], got["usage_bytes"]
        files = stat.get("active_file", 0) + stat.get("inactive_file", 0)
        self.base_bytes = max(0, usage - files)
        cleared = self.clear()
        limit = -(-(self.base_bytes + self.config.fast_tier_bytes) // PAGE) * PAGE
        self.cgroups.set_limit(limit)
        self.limit_bytes = limit
        return {"usage_bytes": usage, "file_bytes": files, "arena_resident_bytes": resident,
                "base_bytes": self.base_bytes, "limit_bytes": limit, **cleared}  # fmt: skip

    def clear(self) -> dict[str, int]:
        """Drop the arena's page cache only: flush, page out the server's mapping of it,
        drop the device's cache. A page the server dirtied after the flush (a store whose
        copy landed after L1 counted its allocation) cannot be dropped until it is written
        back, so the pass repeats, at most ``CLEAR_PASSES`` times, while pages stay. What
        stays resident after the last pass is reported (mlocked pages stay)."""
        assert self.cgroups is not None
        advised = left = 0
        for attempt in range(1, CLEAR_PASSES + 1):
            if attempt > 1:
                time.sleep(CLEAR_PAUSE_S)
            self.flush()
            for pid in self.cgroups.pids():
                ranges = mapped_ranges(pid, self.arena_path)
                if ranges:
                    advised += page_out(pid, ranges)
            fd = self._fd()
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                left = resident_bytes(fd, self.config.arena_bytes)
            finally:
                os.close(fd)
            if left == 0:
                break
        return {"paged_out_bytes": advised, "resident_after_clear_bytes": left,
                "clear_passes": attempt}  # fmt: skip

    def counters(self) -> dict[str, Any]:
        assert self.cgroups is not None and self.loop is not None
        return {**self.cgroups.counters(self.loop.dev), "arena_resident_bytes":
                self.resident_bytes()}  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "arena_path": self.loop.path if self.loop else None,
            "arena_backing": str(self.backing),
            "arena_bytes": self.config.arena_bytes,
            "device": f"{self.loop.dev[0]}:{self.loop.dev[1]}" if self.loop else None,
            "read_ahead_kb": 0,
            "fast_tier_bytes": self.config.fast_tier_bytes,
            "flash_bytes_s": self.config.flash_bytes_s,
            "demand_iops": self.demand_iops,
            "memory_cgroup": str(self.cgroups.memory) if self.cgroups else None,
            "blkio_cgroup": str(self.cgroups.blkio) if self.cgroups else None,
            "base_bytes": self.base_bytes,
            "limit_bytes": self.limit_bytes,
        }

    def down(self) -> list[str]:
        """Remove the cgroups by path (their processes are stopped first), detach the loop
        device, delete the arena file. What could not be removed."""
        left: list[str] = []
        if self.cgroups is not None:
            left += self.cgroups.remove()
            self.cgroups = None
        if self.loop is not None:
            self.detach(self.loop)
            self.loop = None
        self.backing.unlink(missing_ok=True)
        return left


def remove_from_state(desc: dict[str, Any], roots: SysRoots = SysRoots()) -> list[str]:
    """`bsrctl stack down` of a stack whose bsrctl died: its fast tier (``describe()`` in its
    state.json) removed once its processes are stopped: the two cgroups by path (only ones
    this module names, ``bsrctl-*``), the loop device only while it is still backed by this
    arena's file, then the file. What could not be removed."""
    left = []
    for key in ("memory_cgroup", "blkio_cgroup"):
        path = desc.get(key)
        if path and Path(path).name.startswith("bsrctl-") and not _rmdir(Path(path), 10.0):
            left.append(path)
    arena, backing = desc.get("arena_path"), desc.get("arena_backing")
    if arena and backing:
        name = os.path.basename(arena)
        ours = roots.block / name / "loop" / "backing_file"
        if ours.is_file() and ours.read_text().strip() == backing:
            detach_loop(LoopDevice(arena, name, (0, 0)))
        Path(backing).unlink(missing_ok=True)
    return left
