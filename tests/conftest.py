"""How the suite runs two at a time (``make test`` on >= 4 cores: pytest-xdist ``-n 2``).

Work units (``scope_of``): every module is one, so its module-scoped deployment lives on one
worker; ``tests/attach`` (one package-scoped operator deployment), the two two-host modules
and law + sweep (one kept deployment) are one each. A unit goes to one worker whole; the
units run in ``rank`` order.

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
from typing import Any

import pytest

LOCK_ENV = "BSRCTL_TEST_SHM_LOCK"
HEAVY_MARKERS = ("e2e", "mooncake", "process")
# Tests that diff all of /dev/shm or leak segments on purpose (see the docstring).
EXCLUSIVE = (
    "tests/e2e/test_roundtrip.py::test_demo_",  # no new unmapped segment after the run
    "tests/e2e/test_stack_cli.py::",  # the same, across `stack up` and `stack down`
    "tests/experiments/restore/test_e2e_serving_killed.py::",  # leaks until doctor
)
GROUPS = {"tests/attach/": "attach", "tests/failmatrix/test_e2e_two_hosts.py": "two-hosts"}
GROUPS["tests/e2e/test_roundtrip_two_hosts.py"] = "two-hosts"  # one veth pair at a time
# One kept deployment (tests/experiments/restore/conftest.py::smoke_stack) for both modules.
for _m in ("law", "sweep"):
    GROUPS[f"tests/experiments/restore/test_e2e_serving_{_m}.py"] = "smoke-stack"


def lock_mode(item: pytest.Item) -> int | None:
    """LOCK_EX, LOCK_SH or None (a unit test)."""
    nodeid = item.nodeid
    if nodeid.startswith(EXCLUSIVE):
        return fcntl.LOCK_EX
    if any(item.get_closest_marker(m) for m in HEAVY_MARKERS):
        return fcntl.LOCK_SH
    return None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: one lock file for its workers
        fd, path = tempfile.mkstemp(prefix="bsrctl-shm-", suffix=".lock")
        os.close(fd)
        if LOCK_ENV not in os.environ:
            os.environ[LOCK_ENV] = path
            _CREATED.append(Path(path))
        else:
            os.unlink(path)


def scope_of(nodeid: str) -> str:
    """The xdist work unit of a test: its group (``GROUPS``), else its module."""
    path = nodeid.split("::")[0]
    return next((name for prefix, name in GROUPS.items() if path.startswith(prefix)), path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole work units (``scope_of``) to one worker, in collection order (``rank``), for
    every --dist that splits the suite. Not xdist's ``xdist_group`` marker: pytest 9 derives
    a nodeid from ``_id``, so the suffix pytest-xdist 3.8 writes to ``_nodeid`` is lost and
    each test would go anywhere."""
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") not in ("load", "loadscope", "loadfile", "loadgroup"):
        return None

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # ours (pytest_collection_modifyitems) instead
    return Units(config, log)


def rank(item: pytest.Item) -> int:
    """The run order: the operator deployment (the longest unit) first while the other
    worker runs the unit tests, then the modules that are exclusive throughout, then every
    other heavy module (the round trip's demo is exclusive, its other tests are not)."""
    path = item.nodeid.split("::")[0] + "::"
    if path.startswith("tests/attach/"):
        return 0
    if lock_mode(item) is None:
        return 1
    return 2 if path in EXCLUSIVE else 3


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # stable, the same on every worker: by rank, then a work unit's items together at its
    # last item's place (serially too: law and sweep run last in their package, so their
    # kept deployment, package-scoped, is not held while registration's own stack runs)
    last = {scope_of(item.nodeid): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank(item), last[scope_of(item.nodeid)]))


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
    _LOCK.hold(lock_mode(item), scope_of(item.nodeid))
    yield
    if nextitem is None or (lock_mode(nextitem), scope_of(nextitem.nodeid)) != _LOCK.key:
        _LOCK.release()


def pytest_unconfigure(config: pytest.Config) -> None:
    _LOCK.release()
    for path in _CREATED:
        for p in (path, Path(f"{path}.gate")):
            p.unlink(missing_ok=True)
