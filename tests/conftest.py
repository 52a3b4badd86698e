"""How the suite runs two at a time (``make test``: pytest-xdist ``-n 2 --dist loadgroup``).

Every module that starts processes (markers e2e, mooncake, process) is one xdist group, so
its module-scoped deployment lives on one worker; ``tests/attach`` (one package-scoped
operator deployment) and the two two-host modules are one group each.

/dev/shm is the one resource the stacks share: a stack's teardown removes every unmapped
psm_*/lmcache_kv_* segment that appeared since it came up (``remove_unmapped_shm``), and some
tests diff the whole folder or leak segments on purpose. Those (``EXCLUSIVE``) hold an
exclusive flock while they run; every other process-starting test holds it shared, so the
two never overlap. Unit tests take no lock. Without xdist the lock is never contended.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK_ENV = "BSRCTL_TEST_SHM_LOCK"
HEAVY_MARKERS = ("e2e", "mooncake", "process")
# Tests that diff all of /dev/shm or leak segments on purpose (see the docstring).
EXCLUSIVE = (
    "tests/attach/",  # the operator's teardown: no new psm_/lmcache_kv_ segment at all
    "tests/e2e/test_roundtrip.py::test_demo_",  # no new unmapped segment after the run
    "tests/e2e/test_stack_cli.py::",  # the same, across `stack up` and `stack down`
    "tests/experiments/restore/test_e2e_serving_killed.py::",  # leaks until doctor
)
GROUPS = {"tests/attach/": "attach", "tests/failmatrix/test_e2e_two_hosts.py": "two-hosts"}
GROUPS["tests/e2e/test_roundtrip_two_hosts.py"] = "two-hosts"  # one veth pair at a time


def _rel(item: pytest.Item) -> str:
    return item.nodeid.split("@")[0]


def lock_mode(item: pytest.Item) -> int | None:
    """LOCK_EX, LOCK_SH or None (a unit test)."""
    nodeid = _rel(item)
    if nodeid.startswith(EXCLUSIVE):
        return fcntl.LOCK_EX
    if any(item.get_closest_marker(m) for m in HEAVY_MARKERS):
        return fcntl.LOCK_SH
    return None


def group_of(item: pytest.Item) -> str | None:
    path = item.nodeid.split("::")[0]
    for prefix, name in GROUPS.items():
        if path.startswith(prefix):
            return name
    return path if lock_mode(item) is not None else None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: one lock file for its workers
        fd, path = tempfile.mkstemp(prefix="bsrctl-shm-", suffix=".lock")
        os.close(fd)
        if LOCK_ENV not in os.environ:
            os.environ[LOCK_ENV] = path
            _CREATED.append(Path(path))
        else:
            os.unlink(path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # before xdist's own hook, which reads the marker
        name = group_of(item)
        if name is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(name))


class _ShmLock:
    """The worker's hold on the lock: taken before an item's setup (so before its module's
    fixtures), kept while the next item is of the same group and mode, dropped after the
    teardown of the last such item (its module's fixtures are torn down by then).

    Writers first: a worker waiting for LOCK_EX holds the gate, so the other worker cannot
    keep re-taking LOCK_SH at each module boundary (flock itself grants a shared lock
    whenever no one holds it, waiters or not)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.key: tuple[int, str | None] | None = None

    def hold(self, mode: int | None, group: str | None) -> None:
        if (mode, group) == self.key or mode is None:
            return
        self.release()
        base = os.environ[LOCK_ENV]
        gate = os.open(base + ".gate", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            self.fd = os.open(base, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, mode)
        finally:
            os.close(gate)  # closing drops the gate
        self.key = (mode, group)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the lock
        self.fd, self.key = None, None


_LOCK = _ShmLock()
_CREATED: list[Path] = []


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _LOCK.hold(lock_mode(item), group_of(item))
    yield
    if nextitem is None or (lock_mode(nextitem), group_of(nextitem)) != _LOCK.key:
        _LOCK.release()


def pytest_unconfigure(config: pytest.Config) -> None:
    _LOCK.release()
    for path in _CREATED:
        for p in (path, Path(f"{path}.gate")):
            p.unlink(missing_ok=True)
