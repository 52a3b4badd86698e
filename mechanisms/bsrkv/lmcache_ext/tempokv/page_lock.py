"""Protection on the flash tier: ``mlock`` of an object's address range keeps its pages
resident (loaded first, through the server's cgroup and its read throttle: staging), and
``munlock`` at release lets the kernel evict them again.

The kernel does not count mlocks: one ``munlock`` unlocks a page whatever else locked it. So
pages are refcounted here, per owner (an object), and a page is unlocked only when its last
owner lets go. The locker never locks past its budget: a lock that would is refused
(``BudgetExceeded``) before any syscall. Reads of the range happen inside ``mlock`` (it faults
every page in), so a lock can take seconds: it runs outside the locker's lock, its pages
reserved first, and counts as locked once ``mlock`` returned."""

from __future__ import annotations

import ctypes
import mmap
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

PAGE = mmap.PAGESIZE


class BudgetExceeded(RuntimeError):
    """Locking these pages would pass the locker's budget."""


def _libc_call(name: str) -> Callable[[int, int], None]:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, name)

    def call(addr: int, length: int) -> None:
        if fn(ctypes.c_void_p(addr), ctypes.c_size_t(length)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{name}({addr:#x}, {length})")

    return call


def pages_of(ranges: Iterable[tuple[int, int]], page: int = PAGE) -> set[int]:
    """The page addresses covering every [lo, hi) range."""
    out: set[int] = set()
    for lo, hi in ranges:
        if hi > lo:
            out.update(range(lo - lo % page, hi, page))
    return out


def runs(pages: Iterable[int], page: int = PAGE) -> list[tuple[int, int]]:
    """Sorted page addresses as maximal contiguous (start, length) runs."""
    out: list[tuple[int, int]] = []
    for p in sorted(pages):
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + page)
        else:
            out.append((p, page))
    return out


@dataclass
class PageLocker:
    """Refcounted ``mlock``/``munlock`` of owners' address ranges, within ``budget_bytes``."""

    budget_bytes: int
    page: int = PAGE
    mlock: Callable[[int, int], None] = field(default_factory=lambda: _libc_call("mlock"))
    munlock: Callable[[int, int], None] = field(default_factory=lambda: _libc_call("munlock"))
    _refs: dict[int, int] = field(default_factory=dict)  # page -> owners holding it
    _owners: dict[str, frozenset[int]] = field(default_factory=dict)
    _done: set[str] = field(default_factory=set)  # owners whose mlock returned
    _mu: threading.Lock = field(default_factory=threading.Lock)

    @property
    def reserved_bytes(self) -> int:
        """Pages locked or being locked (what the budget bounds)."""
        with self._mu:
            return len(self._refs) * self.page

    @property
    def locked_bytes(self) -> int:
        """Pages of owners whose ``mlock`` returned: resident and protected now."""
        with self._mu:
            held = set().union(*(self._owners[o] for o in self._done)) if self._done else set()
            return len(held) * self.page

    def holds(self, owner: str) -> bool:
        with self._mu:
            return owner in self._done

    def lock(self, owner: str, ranges: Iterable[tuple[int, int]]) -> int:
        """Lock ``owner``'s ranges (their pages read in if not resident); bytes newly
        locked. A second lock of the same owner is a no-op. ``BudgetExceeded`` before any
        syscall if its new pages would pass the budget; an ``OSError`` of ``mlock`` leaves
        nothing of it locked."""
        pages = frozenset(pages_of(ranges, self.page))
        with self._mu:
            if owner in self._owners:
                return 0
            new = [p for p in pages if p not in self._refs]
            if (len(self._refs) + len(new)) * self.page > self.budget_bytes:
                raise BudgetExceeded(
                    f"{owner}: {len(new) * self.page} B more would lock "
                    f"{(len(self._refs) + len(new)) * self.page} B > budget {self.budget_bytes} B"
                )
            for p in pages:
                self._refs[p] = self._refs.get(p, 0) + 1
            self._owners[owner] = pages
        locked: list[tuple[int, int]] = []
        try:
            for start, length in runs(new, self.page):
                self.mlock(start, length)
                locked.append((start, length))
        except BaseException:
            for start, length in locked:
                self.munlock(start, length)
            with self._mu:
                self._release(owner)
            raise
        with self._mu:
            self._done.add(owner)
        return len(new) * self.page

    def unlock(self, owner: str) -> int:
        """Let go of ``owner``'s pages; the ones no other owner holds are munlocked. Bytes
        unlocked (0 for an owner not held)."""
        with self._mu:
            if owner not in self._done:
                if owner in self._owners:
                    raise ValueError(f"{owner}: its mlock has not returned yet")
                return 0
            self._done.discard(owner)
            freed = self._release(owner)
        for start, length in runs(freed, self.page):
            self.munlock(start, length)
        return len(freed) * self.page

    def _release(self, owner: str) -> list[int]:  # holds self._mu
        freed = []
        for p in self._owners.pop(owner):
            self._refs[p] -= 1
            if not self._refs[p]:
                del self._refs[p]
                freed.append(p)
        return freed

    def unlock_all(self) -> int:
        with self._mu:
            owners = list(self._done)
        return sum(self.unlock(o) for o in owners)
