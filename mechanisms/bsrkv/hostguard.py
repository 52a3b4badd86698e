"""bsrkv's code inside a host process (vLLM's engine core, LMCache's server) never takes the
host down: each place the host calls into bsrkv runs bsrkv's part under a ``Guard``, which
turns an exception into what the host would have had without bsrkv (the stock decision, the
stock answer, nothing). One mechanism for every such site, instead of a try/except at each.

A failure is counted per site. Its traceback is logged once per (site, exception type); the
count is logged again at the 2nd, 4th, 8th, ... failure of the site (a failing step hook runs
every few milliseconds: the log stays a few lines). ``on_failure`` sees every failure (the
vLLM adapter writes its ``adapter_error`` trace record there); it is guarded too. Only
``Exception`` is caught: KeyboardInterrupt and SystemExit belong to the host. Nothing here
imports anything of the harness or of a host.

Every failure is also counted process-wide by (guard, site, exception type):
``process_failures()`` is what a host reports to the harness (LMCache's ``bsr.status``,
vLLM's step trace), so a run whose extension degraded to stock cannot read as measuring the
extension. Those counts are cumulative over the process and outlive the guard that counted
them (a reconfigured part's guard is gone, its failures are not)."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")
OnFailure = Callable[[str, BaseException, int], None]
Failure = tuple[str, str, str, int]  # guard, site, exception type, count

_PROCESS: Counter[tuple[str, str, str]] = Counter()
_PROCESS_LOCK = threading.Lock()


def process_failures() -> list[Failure]:
    """Every guard's failures in this process so far, sorted: (guard, site, exception
    type, count)."""
    with _PROCESS_LOCK:
        return sorted((g, s, t, n) for (g, s, t), n in _PROCESS.items())


class Guard:
    """Counts and logs the failures of one component's sites; see the module docstring."""

    def __init__(
        self, name: str, logger: logging.Logger | None = None, on_failure: OnFailure | None = None
    ) -> None:
        self.name = name
        self.log = logger if logger is not None else logging.getLogger(name)
        self.on_failure = on_failure
        self.failures: Counter[str] = Counter()
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.failures.values())

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.failures)

    def failed(self, site: str, exc: BaseException) -> int:
        """Count (and maybe log) a failure of ``site``; its count so far. Never raises."""
        try:
            with self._lock:
                self.failures[site] += 1
                n = self.failures[site]
                kind = (site, type(exc).__name__)
                first = kind not in self._seen
                self._seen.add(kind)
            with _PROCESS_LOCK:
                _PROCESS[(self.name, *kind)] += 1
            if first:
                self.log.error("%s: %s failed, degraded to stock: %r", self.name, site, exc,
                               exc_info=(type(exc), exc, exc.__traceback__))  # fmt: skip
            elif n & (n - 1) == 0:  # 2, 4, 8, ...
                self.log.error("%s: %s failed %d times (last: %r)", self.name, site, n, exc)
            hook = self.on_failure
            if hook is not None:
                hook(site, exc, n)
            return n
        except Exception:  # the guard's own last line: never into the host
            return 0

    def call(self, site: str, fn: Callable[P, T | None], *args: P.args, **kw: P.kwargs) -> T | None:
        """``fn(*args, **kw)``, or None when it raised (counted)."""
        try:
            return fn(*args, **kw)
        except Exception as exc:
            self.failed(site, exc)
            return None

    def run(self, site: str, fallback: T, fn: Callable[P, T], *args: P.args, **kw: P.kwargs) -> T:
        """``fn(*args, **kw)``, or ``fallback`` when it raised (counted)."""
        try:
            return fn(*args, **kw)
        except Exception as exc:
            self.failed(site, exc)
            return fallback


def guarded(
    site: str, fallback: Callable[..., Any], guard: Callable[[Any], Guard]
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """A method whose exception becomes ``fallback(self, exc, *args, **kw)``, counted on
    ``guard(self)``. ``functools.wraps`` keeps the method's name, annotations and the
    attributes a host's decorator set (LMCache finds its handlers by them)."""

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kw: Any) -> T:
            try:
                return fn(self, *args, **kw)
            except Exception as exc:
                guard(self).failed(site, exc)
                return fallback(self, exc, *args, **kw)  # type: ignore[no-any-return]

        return wrapper

    return decorate
