"""The flash tier's manager (``stack/launch/fast_tier.py``) against an injected sysfs root: the
exact values it writes (readahead, throttle, memory limit), where it makes its cgroups (children
of this process's own), removal by path, and the exit-3 refusal when a controller, the
throttle or readahead cannot be set (nothing left behind). The kernel side (loop device,
page faults through the throttle, clearing) runs in the serving e2e."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bsrctl.errors import StackFailed
from bsrctl.stack.launch import fast_tier as ft
from bsrctl.stack.launch.fast_tier import FastTier, FastTierConfig, LoopDevice, SysRoots

MIB = 1 << 20
CONFIG = FastTierConfig(arena_bytes=8 * MIB, fast_tier_bytes=4 * MIB, flash_bytes_s=11 * MIB)


@pytest.fixture
def sysfs(tmp_path: Path) -> SysRoots:
    """cgroup v1 memory (this process in /parent/me) and blkio (in /), one loop device."""
    root = tmp_path / "sys"
    for controller, own in (("memory", "parent/me"), ("blkio", "")):
        d = root / "cgroup" / controller
        (d / own).mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("1\n")
    ra = root / "block" / "loop7" / "queue" / "read_ahead_kb"
    ra.parent.mkdir(parents=True)
    ra.write_text("128\n")
    self_cgroup = root / "self-cgroup"
    self_cgroup.write_text("9:name=systemd:/\n7:blkio:/\n4:memory:/parent/me\n1:cpu:/\n")
    return SysRoots(root / "cgroup", root / "block", self_cgroup)


class Loops:
    def __init__(self) -> None:
        self.attached: list[Path] = []
        self.detached: list[LoopDevice] = []

    def attach(self, backing: Path) -> LoopDevice:
        self.attached.append(backing)
        return LoopDevice("/dev/loop7", "loop7", (7, 7))

    def detach(self, dev: LoopDevice) -> None:
        self.detached.append(dev)


def tier(tmp_path: Path, roots: SysRoots, loops: Loops) -> FastTier:
    return FastTier(CONFIG, tmp_path / "stack" / "fast-tier", roots, loops.attach, loops.detach)


@pytest.fixture
def removed(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """rmdir as the kernel does it for a cgroup (its control files go with it), recorded."""
    got: list[Path] = []

    def rmdir(path: Path, timeout_s: float = 0.0) -> bool:
        got.append(path)
        if not path.exists():
            return True
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
        return True

    monkeypatch.setattr(ft, "_rmdir", rmdir)
    return got


def test_up_writes_exact_values_and_makes_children_of_its_own_cgroups(
    tmp_path: Path, sysfs: SysRoots, removed: list[Path]
) -> None:
    loops = Loops()
    t = tier(tmp_path, sysfs, loops)
    t.up()
    name = f"bsrctl-{os.getpid()}-loop7"
    memory = sysfs.cgroup / "memory" / "parent" / "me" / name
    blkio = sysfs.cgroup / "blkio" / name
    assert t.cgroups is not None
    assert (t.cgroups.memory, t.cgroups.blkio) == (memory, blkio)
    assert t.backing.stat().st_size == 8 * MIB  # the arena, pre-sized
    assert loops.attached == [t.backing]
    assert (sysfs.block / "loop7" / "queue" / "read_ahead_kb").read_text() == "0"
    assert (blkio / "blkio.throttle.read_bps_device").read_text() == "7:7 11534336"
    assert t.arena_path == "/dev/loop7"
    assert t.join_prefix()[1:] == ("-m", "bsrctl.stack.launch.cgroup_join",
                                   str(memory / "cgroup.procs"), str(blkio / "cgroup.procs"),
                                   "--")  # fmt: skip
    t.cgroups.set_limit(423002112)
    assert (memory / "memory.limit_in_bytes").read_text() == "423002112"
    assert t.describe()["device"] == "7:7" and t.describe()["flash_bytes_s"] == 11 * MIB
    assert t.down() == []
    assert removed == [memory, blkio]  # by path, its own two only
    assert not memory.exists() and not blkio.exists()
    assert (sysfs.cgroup / "memory" / "parent" / "me").is_dir()  # its parent untouched
    assert [d.name for d in loops.detached] == ["loop7"] and not t.backing.exists()


def test_counters_read_the_cgroup_and_the_arena_device_only(
    tmp_path: Path, sysfs: SysRoots, removed: list[Path]
) -> None:
    t = tier(tmp_path, sysfs, Loops())
    t.up()
    assert t.cgroups is not None
    m, b = t.cgroups.memory, t.cgroups.blkio
    (m / "memory.stat").write_text("cache 4096\nrss 7319552\nmapped_file 4096\nswap 0\n")
    for name, value in (("usage_in_bytes", 7323648), ("max_usage_in_bytes", 9000000),
                        ("failcnt", 3), ("limit_in_bytes", 423002112)):  # fmt: skip
        (m / f"memory.{name}").write_text(f"{value}\n")
    (b / "blkio.throttle.io_service_bytes").write_text(
        "7:7 Read 25165824\n7:7 Write 0\n253:0 Read 99\nTotal 25165824\n"
    )
    (b / "blkio.throttle.io_serviced").write_text("7:7 Read 6144\n7:7 Write 0\nTotal 6144\n")
    got = t.cgroups.counters((7, 7))
    assert got == {
        "memory_stat": {"cache": 4096, "rss": 7319552, "mapped_file": 4096},
        "usage_bytes": 7323648,
        "max_usage_bytes": 9000000,
        "failcnt": 3,
        "limit_bytes": 423002112,
        "throttle_io_service_bytes": {"Read": 25165824, "Write": 0},
        "throttle_io_serviced": {"Read": 6144, "Write": 0},
    }
    t.down()


@pytest.mark.parametrize("missing", ["memory", "blkio"])
def test_a_missing_controller_is_exit_3_naming_it_and_leaves_nothing(
    tmp_path: Path, sysfs: SysRoots, missing: str, removed: list[Path]
) -> None:
    (sysfs.cgroup / missing / "cgroup.procs").unlink()  # not mounted
    loops = Loops()
    t = tier(tmp_path, sysfs, loops)
    with pytest.raises(StackFailed, match=f"cgroup v1 {missing} controller is not mounted") as e:
        t.up()
    assert e.value.exit_code == 3
    assert not list((sysfs.cgroup / "memory" / "parent" / "me").glob("bsrctl-*"))
    assert not list((sysfs.cgroup / "blkio").glob("bsrctl-*"))
    assert len(loops.detached) == 1 and not t.backing.exists()


def test_no_cgroup_of_this_process_for_a_controller_is_exit_3(
    tmp_path: Path, sysfs: SysRoots, removed: list[Path]
) -> None:
    sysfs.self_cgroup.write_text("4:memory:/parent/me\n0::/\n")  # blkio only in cgroup v2
    with pytest.raises(StackFailed, match="no cgroup v1 blkio controller for this process"):
        tier(tmp_path, sysfs, Loops()).up()


def test_a_throttle_that_cannot_be_set_is_exit_3(
    tmp_path: Path, sysfs: SysRoots, monkeypatch: pytest.MonkeyPatch, removed: list[Path]
) -> None:
    real = ft._write

    def write(path: Path, value: str, what: str) -> None:
        if path.name == "blkio.throttle.read_bps_device":
            raise StackFailed(f"fast tier: cannot set {what} ({path}: Invalid argument)")
        real(path, value, what)

    monkeypatch.setattr(ft, "_write", write)
    loops = Loops()
    t = tier(tmp_path, sysfs, loops)
    with pytest.raises(StackFailed, match="cannot set blkio.throttle.read_bps_device"):
        t.up()
    assert [p.name for p in removed] == [f"bsrctl-{os.getpid()}-loop7"] * 2  # both, by path
    assert len(loops.detached) == 1


def test_readahead_that_cannot_be_turned_off_is_exit_3(
    tmp_path: Path, sysfs: SysRoots, removed: list[Path]
) -> None:
    (sysfs.block / "loop7" / "queue" / "read_ahead_kb").unlink()
    (sysfs.block / "loop7" / "queue").rmdir()
    loops = Loops()
    with pytest.raises(StackFailed, match="cannot set read_ahead_kb of /dev/loop7"):
        tier(tmp_path, sysfs, loops).up()
    assert removed == [] and len(loops.detached) == 1  # no cgroup was made


def test_mapped_ranges_of_the_arena_from_proc_maps(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_text(
        "7f69cd7fb000-7f69d17fb000 rw-s 00000000 00:06 93                 /dev/loop0\n"
        "7f69d17fb000-7f69d17fc000 r--p 00000000 fd:00 11                 /usr/lib/libc.so\n"
        "7f70cd7fb000-7f70cd7fc000 rw-s 00000000 00:06 94                 /dev/loop01\n"
    )
    assert ft.mapped_ranges(42, "/dev/loop0", tmp_path) == [(0x7F69CD7FB000, 0x7F69D17FB000)]
    assert ft.mapped_ranges(43, "/dev/loop0", tmp_path) == []


def test_stack_down_from_state_removes_the_tier_of_a_dead_run(
    tmp_path: Path, sysfs: SysRoots, removed: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    loops = Loops()
    t = tier(tmp_path, sysfs, loops)
    t.up()
    desc = t.describe()  # what state.json holds while the stack is up
    back = sysfs.block / "loop7" / "loop" / "backing_file"
    back.parent.mkdir()
    back.write_text(f"{t.backing}\n")
    detached: list[str] = []
    monkeypatch.setattr(ft, "detach_loop", lambda dev: detached.append(dev.path))
    assert ft.remove_from_state(desc, sysfs) == []
    assert [p.name for p in removed] == [f"bsrctl-{os.getpid()}-loop7"] * 2
    assert detached == ["/dev/loop7"] and not t.backing.exists()
    back.write_text("/somewhere/else.img\n")  # the loop device was reused by someone else
    removed.clear()
    assert ft.remove_from_state(desc, sysfs) == [] and detached == ["/dev/loop7"]


@pytest.mark.parametrize(
    ("resident", "passes", "left", "pauses"),
    [
        ([28672, 0], 2, 0, [0.2]),  # a late store's dirty pages: dropped on the next pass
        ([0], 1, 0, []),
        ([4096] * 5, 5, 4096, [0.2] * 4),  # bounded: what stays is reported, never hidden
    ],
)
def test_clear_repeats_while_pages_stay_and_reports_what_stays(
    tmp_path: Path,
    sysfs: SysRoots,
    removed: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    resident: list[int],
    passes: int,
    left: int,
    pauses: list[float],
) -> None:
    t = tier(tmp_path, sysfs, Loops())
    t.up()
    assert t.cgroups is not None
    (t.cgroups.memory / "cgroup.procs").write_text("")  # no server yet: nothing mapped
    flushes: list[int] = []
    slept: list[float] = []
    got = iter(resident)
    monkeypatch.setattr(t, "flush", lambda: flushes.append(1))
    monkeypatch.setattr(t, "_fd", lambda: os.open(t.backing, os.O_RDONLY))
    monkeypatch.setattr(ft, "resident_bytes", lambda fd, size: next(got))
    monkeypatch.setattr(ft.time, "sleep", slept.append)
    cleared = t.clear()
    assert cleared == {"paged_out_bytes": 0, "resident_after_clear_bytes": left,
                       "clear_passes": passes}  # fmt: skip
    assert len(flushes) == passes and slept == pauses
    t.down()


def test_the_demand_path_is_an_iops_rule_beside_the_bandwidth_one(
    tmp_path: Path, sysfs: SysRoots, removed: list[Path]
) -> None:
    """Two read paths: bytes/s bounds large reads, requests/s bounds 4 KiB faults; the
    second is set at up (from the config) and again between cells (``set_demand``)."""
    loops = Loops()
    cfg = FastTierConfig(8 * MIB, 4 * MIB, 11 * MIB, demand_iops=1193)
    t = FastTier(cfg, tmp_path / "stack" / "fast-tier", sysfs, loops.attach, loops.detach)
    t.up()
    blkio = sysfs.cgroup / "blkio" / f"bsrctl-{os.getpid()}-loop7"
    assert (blkio / "blkio.throttle.read_bps_device").read_text() == "7:7 11534336"
    assert (blkio / "blkio.throttle.read_iops_device").read_text() == "7:7 1193"
    assert t.describe()["demand_iops"] == 1193
    t.set_demand(2816)  # ratio 1: 11 MiB/s of 4 KiB reads
    assert (blkio / "blkio.throttle.read_iops_device").read_text() == "7:7 2816"
    assert t.describe()["demand_iops"] == 2816
    assert t.down() == []


def test_no_demand_rule_unless_asked(tmp_path: Path, sysfs: SysRoots, removed: list[Path]) -> None:
    t = tier(tmp_path, sysfs, Loops())
    t.up()
    blkio = sysfs.cgroup / "blkio" / f"bsrctl-{os.getpid()}-loop7"
    assert not (blkio / "blkio.throttle.read_iops_device").exists()
    assert t.describe()["demand_iops"] == 0
    t.down()
