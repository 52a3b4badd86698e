"""How the suite runs two at a time (``make test`` from 2 cores up: pytest-xdist ``-n 2``).

Work units (``scope_of``): every module is one, so its module-scoped deployment lives on one
worker; ``tests/e2e/attach`` (one package-scoped operator deployment), the two two-host modules,
law + sweep (one kept deployment) and the modules with exclusive tests are one each. A unit
goes to one worker whole; the units run in ``rank`` order, the longest heavy ones first
(``LONGEST_FIRST``).

/dev/shm is the one resource the stacks share: a stack's teardown removes every unmapped
psm_*/lmcache_kv_* segment that appeared since it came up (``remove_unmapped_shm``), and some
tests diff the whole folder or leak segments on purpose. Those (``EXCLUSIVE``) hold an
exclusive flock while they run; every other process-starting test holds it shared, so the
two never overlap. Unit tests take no lock, so the exclusive unit runs first, beside them.
Without xdist the lock is never contended.

Reference vLLMs (canonical outputs) come from one pool for the session
(``bsrctl.stack.measure.reference_pool``): one per launch, stopped by PID when the session ends.

Hypothesis runs derandomized (profile ``same``: the same examples on every machine, no example
database); ``make fuzz`` loads ``fuzz`` (random seeds, FUZZ_FACTOR times the examples, the
property tests only). SIGTERM ends a session as ^C does, so every fixture is torn down.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.internal.detection import is_hypothesis_test

from bsrctl.stack.launch.shm_ledger import LEDGER_ENV
from bsrctl.stack.measure.reference_pool import POOL_ENV, close_pool

LOCK_ENV = "BSRCTL_TEST_SHM_LOCK"
HEAVY_MARKERS = ("e2e", "mooncake", "process")
# Tests that diff all of /dev/shm or leak segments on purpose (see the docstring).
EXCLUSIVE = (
    "tests/e2e/test_roundtrip.py::test_demo_",  # no new unmapped segment after the run
    "tests/e2e/test_stack_cli.py::",  # the same, across `stack up` and `stack down`
    "tests/e2e/serving/test_e2e_serving_killed.py::",  # leaks until doctor
)
GROUPS = {"tests/e2e/attach/": "attach", "tests/e2e/failmatrix/test_e2e_two_hosts.py": "two-hosts"}
GROUPS["tests/e2e/test_roundtrip_two_hosts.py"] = "two-hosts"  # one veth pair at a time
# The modules with exclusive tests, one unit: one worker runs them while the other runs the
# unit tests (which take no lock), so no heavy module waits on them (``rank``).
for _p in EXCLUSIVE:
    GROUPS[_p.split("::")[0]] = "exclusive"
# One kept deployment (tests/e2e/serving/conftest.py::smoke_stack) for both modules.
for _m in ("law", "sweep"):
    GROUPS[f"tests/e2e/serving/test_e2e_serving_{_m}.py"] = "smoke-stack"
# The heavy units that take longest, longest first: two workers end together when the long
# units go out first (in collection order, the TempoKV serving module came last and ran
# alone for its ~400 s). Measured: `make test --junitxml`, seconds per unit on 2 cores:
# failmatrix 414, tempokv serving 399, two-hosts 279, ladder 169, server 120, registration
# 103, smoke-stack 96, on/off 78; the rest under 35 s each keep collection order.
LONGEST_FIRST = (
    "tests/e2e/failmatrix/test_e2e_failmatrix.py",
    "tests/e2e/test_tempokv_serving.py",
    "two-hosts",
    "tests/e2e/serving/test_e2e_serving_ladder.py",
    "tests/e2e/lmcache_ext/test_e2e_server.py",
    "tests/e2e/serving/test_e2e_serving_registration.py",
    "smoke-stack",
    "tests/bsrctl/mechanisms/vllm_ext/test_adapter_onoff.py",
)


def lock_mode(item: pytest.Item) -> int | None:
    """LOCK_EX, LOCK_SH or None (a unit test)."""
    nodeid = item.nodeid
    if nodeid.startswith(EXCLUSIVE):
        return fcntl.LOCK_EX
    if any(item.get_closest_marker(m) for m in HEAVY_MARKERS):
        return fcntl.LOCK_SH
    return None


# A test's own @settings(max_examples=...) inherits the rest from the profile loaded when its
# module is imported: "same" (pytest_configure), or --hypothesis-profile's (loaded after it,
# before collection imports the modules).
# No deadline and no too_slow check in either: a verdict never depends on the machine's speed.
SAME = settings(
    derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
settings.register_profile("same", SAME)
# Failures found are kept (and replayed first by the next fuzz run) until pinned as @example.
FUZZ_DB = Path(__file__).resolve().parents[1] / ".hypothesis" / "fuzz"
settings.register_profile(
    "fuzz", SAME, derandomize=False, database=DirectoryBasedExampleDatabase(FUZZ_DB)
)
FUZZ_FACTOR = 10  # fuzz: each property test runs this many times its own example count


def randomized(items: list[pytest.Item]) -> list[str]:
    """Property tests whose own @settings undo the derandomized profile (derandomize=False,
    a database: they would draw other examples on another machine or run; a deadline, or a
    health-check list without too_slow: their verdict would depend on the machine's speed)."""
    out = []
    for item in items:
        fn = getattr(item, "obj", None)
        if fn is None or not is_hypothesis_test(fn):
            continue
        own = fn._hypothesis_internal_use_settings
        timed = own.deadline is not None or HealthCheck.too_slow not in own.suppress_health_check
        if not own.derandomize or own.database is not None or timed:
            out.append(item.nodeid)
    return out


def fuzz_only(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fuzz profile: the property tests alone, FUZZ_FACTOR times their examples."""
    keep = [i for i in items if is_hypothesis_test(getattr(i, "obj", None))]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
    for fn in {id(i.obj): i.obj for i in keep}.values():  # type: ignore[attr-defined]
        own = fn._hypothesis_internal_use_settings  # once per function, not per parameter
        fn._hypothesis_internal_use_settings = settings(
            own, max_examples=own.max_examples * FUZZ_FACTOR
        )


_TERMINATING: list[int] = []


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI cancel, `timeout`, a supervisor) ends the session as ^C does: pytest
    then runs every fixture's teardown, which stops its processes by PID; without this the
    interpreter dies at once and leaves them running (they are in sessions of their own).
    A second SIGTERM during that teardown is ignored (SIGKILL still ends it)."""
    if _TERMINATING:
        return
    _TERMINATING.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's plugin loads --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    # here, not at import: a module that imports this one (`from conftest import`) would
    # load it again after --hypothesis-profile's
    settings.load_profile("same")
    try:
        signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: whoever embeds pytest owns the signals
        pass
    if not hasattr(config, "workerinput"):  # the controller: one lock file for its workers
        fd, path = tempfile.mkstemp(prefix="bsrctl-shm-", suffix=".lock")
        os.close(fd)
        if LOCK_ENV not in os.environ:
            os.environ[LOCK_ENV] = path
            _CREATED.append(Path(path))
        else:
            os.unlink(path)
        # one reference vLLM per launch for the whole session, workers and the bsrctl they
        # run alike (bsrctl.stack.measure.reference_pool); stopped by PID in pytest_unconfigure
        if POOL_ENV not in os.environ:
            os.environ[POOL_ENV] = tempfile.mkdtemp(prefix="bsrctl-refpool-")
            _POOLS.append(Path(os.environ[POOL_ENV]))


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
    """The run order, one rank for a whole unit but the first: the modules with exclusive
    tests (one unit, ``GROUPS``), its exclusive tests first, while the other worker runs
    the unit tests (so a heavy unit taken when those run out cannot hold the shared lock
    while an exclusive test waits); then the operator deployment (the longest unit), then
    every other heavy module."""
    scope = scope_of(item.nodeid)
    if scope == "exclusive":
        return 0 if lock_mode(item) == fcntl.LOCK_EX else 1
    if scope == "attach":
        return 3
    return 2 if lock_mode(item) is None else 4


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if settings.get_current_profile_name() == "fuzz":
        fuzz_only(config, items)
    elif bad := randomized(items):
        raise pytest.UsageError(
            f"{bad}: drop derandomize=, database= and deadline= from their @settings and keep "
            "HealthCheck.too_slow in a suppress_health_check of their own (the suite's profile "
            "derandomizes and never times, tests/conftest.py; `make fuzz` explores)"
        )
    # stable, the same on every worker: by rank, then a work unit's items together at its
    # last item's place (serially too: law and sweep run last in their package, so their
    # kept deployment, package-scoped, is not held while registration's own stack runs)
    last = {scope_of(item.nodeid): i for i, item in enumerate(items)}
    # a unit's place is its heaviest item's rank: xdist queues a unit where its first item
    # is, so a module with unit and heavy tests must not go out among the unit tests
    placed: dict[str, int] = {}
    for item in items:
        scope = scope_of(item.nodeid)
        placed[scope] = max(placed.get(scope, 0), rank(item))

    def key(item: pytest.Item) -> tuple[int, int, int]:
        scope = scope_of(item.nodeid)
        first = rank(item) if scope == "exclusive" else placed[scope]
        longest = LONGEST_FIRST.index(scope) if scope in LONGEST_FIRST else len(LONGEST_FIRST)
        return (first, longest, last[scope])

    items.sort(key=key)


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
_POOLS: list[Path] = []


@pytest.fixture(autouse=True)
def _unit_ledger(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Unit tests get a /dev/shm ledger of their own (bsrctl.stack.launch.shm_ledger): every
    experiment command reclaims dead runs' segments first and says so in a line, and a dead
    run of a heavy test beside them (two workers) must not add that line to the output a
    unit test checks, nor a unit test reclaim what a heavy test is about to."""
    if lock_mode(request.node) is None:
        ledger = tmp_path_factory.getbasetemp() / "unit-shm-ledger"
        monkeypatch.setenv(LEDGER_ENV, str(ledger))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _LOCK.hold(lock_mode(item), scope_of(item.nodeid))
    yield
    if nextitem is None or (lock_mode(nextitem), scope_of(nextitem.nodeid)) != _LOCK.key:
        _LOCK.release()


def session_leftovers(pool: Path) -> dict[int, str]:
    """Processes still alive whose environment names this session's pool (every process a
    test started inherits it; the pool's path is this session's alone), each with the test
    that started it (its ``PYTEST_CURRENT_TEST``) and its command line. This process's own
    children are left out: they end with it (multiprocessing's resource tracker is one)."""
    import psutil

    out: dict[int, str] = {}
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or proc.ppid() == os.getpid():
                continue
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get(POOL_ENV) == str(pool):
            try:
                argv = " ".join(proc.cmdline())[:160]
            except psutil.Error:
                argv = "?"
            out[proc.pid] = f"{env.get('PYTEST_CURRENT_TEST', '?')}: {argv}"
    return out


def pytest_unconfigure(config: pytest.Config) -> None:
    from bsrctl.stack.launch.process import stop_pids

    _LOCK.release()
    for pool in _POOLS:
        left = close_pool(pool)
        assert left == [], f"reference vLLMs still alive after the pool closed: {left}"
        # Seen once (2026-12-03): two reference vLLMs outlived close_pool, their records
        # gone; what leaked them is not known. Stop them by PID and name who started them.
        stray = session_leftovers(pool)
        if stray:
            stop_pids(sorted(stray), 15.0)
            print(f"\nWARNING: {len(stray)} process(es) of this session outlived every test "
                  f"and the pool; stopped by PID: {stray}", file=sys.stderr)  # fmt: skip
        shutil.rmtree(pool, ignore_errors=True)
    for path in _CREATED:
        for p in (path, Path(f"{path}.gate")):
            p.unlink(missing_ok=True)
