"""The /dev/shm ledger: reclaim removes exactly the segments a dead stack named, only when
every owner is gone and nothing maps them."""

from __future__ import annotations

import json
import mmap
import os
import secrets
import subprocess
from pathlib import Path

import pytest

from bsrctl.stack.launch import shm_ledger

SHM = Path("/dev/shm")


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(shm_ledger.LEDGER_ENV, str(tmp_path / "ledger"))
    return tmp_path / "ledger"


@pytest.fixture
def segments():
    """make(tag) -> a fresh 4 KiB segment under /dev/shm; all removed at the end."""
    made: list[Path] = []

    def make(tag: str) -> str:
        name = f"bsrctl_test_{os.getpid()}_{secrets.token_hex(4)}_{tag}"
        (SHM / name).write_bytes(b"\0" * 4096)
        made.append(SHM / name)
        return name

    yield make
    for p in made:
        p.unlink(missing_ok=True)


def test_only_named_unmapped_segments_of_dead_owners_go(ledger: Path, segments) -> None:
    a, b, c, d = (segments(t) for t in "abcd")
    proc = subprocess.Popen(["sleep", "60"])
    shm_ledger.record("dead", [a, b], [proc.pid], Path("/run/x"))
    shm_ledger.record("alive", [d], [os.getpid()], Path("/run/y"))
    proc.kill()
    proc.wait()
    with open(SHM / b, "r+b") as fh, mmap.mmap(fh.fileno(), 4096) as mapped:
        gone = shm_ledger.reclaim()
        assert [(r.name, r.bytes, r.run_dir) for r in gone] == [(a, 4096, "/run/x")]
        assert (SHM / b).exists()  # mapped by this process: kept, still on record
        assert json.loads((ledger / "dead.json").read_text())["segments"] == [b]
        mapped[0] = 1
    assert (SHM / c).exists() and (SHM / d).exists()  # not named / owner alive
    assert [r.name for r in shm_ledger.reclaim()] == [b]  # unmapped now: it goes
    assert sorted(p.name for p in ledger.iterdir()) == ["alive.json"]
    assert (SHM / c).exists() and (SHM / d).exists()


def test_a_reused_pid_is_not_the_owner(ledger: Path, segments) -> None:
    a = segments("a")
    shm_ledger.record("mine", [a], [os.getpid()], Path("/run/x"))
    doc = json.loads((ledger / "mine.json").read_text())
    doc["owners"] = {str(os.getpid()): 1.0}  # same PID, another start time: another process
    (ledger / "mine.json").write_text(json.dumps(doc))
    assert [r.name for r in shm_ledger.reclaim()] == [a]


def test_a_held_open_segment_is_in_use(ledger: Path, segments) -> None:
    a = segments("a")
    shm_ledger.record("gone", [a], [], Path("/run/x"))
    with open(SHM / a, "rb"):
        assert shm_ledger.reclaim() == []
    assert [r.name for r in shm_ledger.reclaim()] == [a]


def test_a_name_outside_dev_shm_is_never_touched(ledger: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    shm_ledger.record("evil", ["../../" + str(victim)], [], Path("/run/x"))
    assert shm_ledger.reclaim() == [] and victim.exists()
