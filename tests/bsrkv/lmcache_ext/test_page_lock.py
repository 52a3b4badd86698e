"""The flash tier's protection (``page_lock.PageLocker``): real ``mlock`` of a small real
file's mapping. Checked against the kernel's own count (``VmLck`` of this process): the
exact bytes locked and unlocked, pages shared by two owners unlocked only with the last,
the budget never passed (a lock that would pass it is refused before any syscall), and a
failed ``mlock`` leaving nothing locked; then the same under random sequences (hypothesis)."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bsrkv.lmcache_ext.tempokv.page_lock import PAGE, BudgetExceeded, PageLocker, pages_of, runs

PAGES = 16  # 64 KiB: within the smallest RLIMIT_MEMLOCK a non-root CI runner has


def vm_locked_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmLck:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmLck in /proc/self/status")


@pytest.fixture
def region(tmp_path: Path) -> Iterator[int]:
    """The address of a shared mapping of a real 16-page file."""
    path = tmp_path / "arena"
    path.write_bytes(b"\x5a" * (PAGES * PAGE))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), PAGES * PAGE, flags=mmap.MAP_SHARED)
    buf = (ctypes.c_char * (PAGES * PAGE)).from_buffer(m)
    try:
        yield ctypes.addressof(buf)
    finally:
        del buf
        m.close()


def test_pages_and_runs() -> None:
    assert pages_of([(10, 20), (PAGE - 1, PAGE + 1)], PAGE) == {0, PAGE}
    assert pages_of([(5, 5)], PAGE) == set()
    assert runs([3 * PAGE, PAGE, 0, 5 * PAGE], PAGE) == [(0, 2 * PAGE), (3 * PAGE, PAGE),
                                                         (5 * PAGE, PAGE)]  # fmt: skip


def test_exact_bytes_locked_and_unlocked_with_shared_pages(region: int) -> None:
    base = vm_locked_bytes()
    lk = PageLocker(budget_bytes=8 * PAGE)
    a = [(region, region + 4 * PAGE)]  # pages 0-3
    b = [(region + 2 * PAGE, region + 6 * PAGE)]  # pages 2-5: two shared with a
    assert lk.lock("a", a) == 4 * PAGE
    assert vm_locked_bytes() - base == 4 * PAGE and lk.locked_bytes == 4 * PAGE
    assert lk.lock("a", a) == 0  # the same owner again: nothing more
    assert lk.lock("b", b) == 2 * PAGE
    assert vm_locked_bytes() - base == 6 * PAGE and lk.locked_bytes == 6 * PAGE
    assert lk.unlock("a") == 2 * PAGE  # pages 0-1 only: 2-3 are still b's
    assert vm_locked_bytes() - base == 4 * PAGE and lk.locked_bytes == 4 * PAGE
    assert lk.unlock("a") == 0
    assert lk.unlock("b") == 4 * PAGE
    assert vm_locked_bytes() == base and lk.locked_bytes == 0 and lk.reserved_bytes == 0


def test_the_budget_is_never_passed_and_refusal_makes_no_syscall(region: int) -> None:
    calls: list[tuple[int, int]] = []
    lk = PageLocker(budget_bytes=3 * PAGE, mlock=lambda a, n: calls.append((a, n)),
                    munlock=lambda a, n: None)  # fmt: skip
    lk.lock("a", [(region, region + 2 * PAGE)])
    with pytest.raises(BudgetExceeded, match="> budget 12288 B"):
        lk.lock("b", [(region + 2 * PAGE, region + 4 * PAGE)])
    assert calls == [(region, 2 * PAGE)] and lk.reserved_bytes == 2 * PAGE
    assert not lk.holds("b")
    lk.lock("c", [(region + PAGE, region + 3 * PAGE)])  # one new page: 3 in all, fits
    assert calls[-1] == (region + 2 * PAGE, PAGE) and lk.locked_bytes == 3 * PAGE


def test_a_failed_mlock_leaves_nothing_of_it_locked(region: int) -> None:
    base = vm_locked_bytes()
    real = PageLocker(budget_bytes=PAGES * PAGE)
    seen: list[int] = []

    def mlock(addr: int, n: int) -> None:
        seen.append(addr)
        if len(seen) == 2:
            raise OSError(12, "mlock: ENOMEM")
        real.mlock(addr, n)

    lk = PageLocker(budget_bytes=PAGES * PAGE, mlock=mlock, munlock=real.munlock)
    gaps = [(region, region + PAGE), (region + 2 * PAGE, region + 3 * PAGE)]  # two runs
    with pytest.raises(OSError, match="ENOMEM"):
        lk.lock("a", gaps)
    assert vm_locked_bytes() == base and lk.reserved_bytes == 0 and not lk.holds("a")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    budget_pages=st.integers(1, PAGES),
    ops=st.lists(
        st.tuples(
            st.sampled_from("abcdef"), st.booleans(), st.integers(0, PAGES - 1), st.integers(1, 5)
        ),  # fmt: skip
        max_size=30,
    ),
)
def test_random_locks_match_the_kernel_and_stay_within_budget(
    region: int, budget_pages: int, ops: list[tuple[str, bool, int, int]]
) -> None:
    base = vm_locked_bytes()
    lk = PageLocker(budget_bytes=budget_pages * PAGE)
    held: dict[str, set[int]] = {}
    try:
        for owner, lock, first, n in ops:
            if lock:
                pages = set(range(first, min(PAGES, first + n)))
                try:
                    lk.lock(owner, [(region + first * PAGE, region + (max(pages) + 1) * PAGE)])
                except BudgetExceeded:
                    assert len(set().union(*held.values(), pages)) > budget_pages
                    continue
                held.setdefault(owner, pages)
            else:
                lk.unlock(owner)
                held.pop(owner, None)
            want = len(set().union(*held.values())) * PAGE if held else 0
            assert lk.locked_bytes == want == vm_locked_bytes() - base
            assert want <= budget_pages * PAGE
    finally:
        lk.unlock_all()
    assert vm_locked_bytes() == base
