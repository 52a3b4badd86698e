"""The host guard: a failure becomes the fallback, is counted per site, its traceback logged
once per (site, exception type) and its count at the 2nd, 4th, 8th, ... failure; the hook
sees every one and cannot raise through; KeyboardInterrupt and SystemExit pass."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bsrkv.hostguard import Guard, guarded


def boom(exc: BaseException) -> None:
    raise exc


def test_failures_become_the_fallback_and_are_logged_sparingly(caplog) -> None:
    seen: list[tuple[str, int]] = []
    g = Guard("t", logging.getLogger("t"), on_failure=lambda s, e, n: seen.append((s, n)))
    with caplog.at_level(logging.ERROR, logger="t"):
        assert g.run("a", 7, lambda: 1) == 1
        assert [g.run("a", 7, boom, ValueError("x")) for _ in range(9)] == [7] * 9
        assert g.call("a", boom, KeyError("k")) is None
        assert g.call("b", boom, ValueError("y")) is None
    assert g.counts() == {"a": 10, "b": 1} and g.total == 11
    assert seen == [("a", n) for n in range(1, 11)] + [("b", 1)]
    lines = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines == [
        ("t: a failed, degraded to stock: ValueError('x')", True),
        ("t: a failed 2 times (last: ValueError('x'))", False),
        ("t: a failed 4 times (last: ValueError('x'))", False),
        ("t: a failed 8 times (last: ValueError('x'))", False),
        ("t: a failed, degraded to stock: KeyError('k')", True),  # a new kind: its traceback
        ("t: b failed, degraded to stock: ValueError('y')", True),
    ]


def test_a_raising_hook_and_host_exits() -> None:
    g = Guard("t", on_failure=lambda *_a: boom(RuntimeError("hook")))
    assert g.run("a", 0, boom, ValueError()) == 0  # the hook's own failure goes nowhere
    for exc in (KeyboardInterrupt(), SystemExit(3)):
        with pytest.raises(type(exc)):
            g.call("a", boom, exc)


def test_a_guarded_method_keeps_its_metadata() -> None:
    class M:
        def __init__(self) -> None:
            self.g = Guard("m")

        @guarded("m.f", lambda self, exc, x: f"failed {x}: {exc}", lambda self: self.g)
        def f(self, x: int) -> str:
            """doc"""
            if x < 0:
                raise ValueError("negative")
            return str(x)

    m = M()
    assert (m.f(2), m.f(-1)) == ("2", "failed -1: negative")
    assert (M.f.__name__, M.f.__doc__, m.g.counts()) == ("f", "doc", {"m.f": 1})


@given(st.lists(st.sampled_from("abc"), max_size=60))
def test_counts_are_exact_per_site(sites: list[str]) -> None:
    g = Guard("p", logging.getLogger("p.quiet"))
    for s in sites:
        g.call(s, boom, ValueError(s))
    assert g.counts() == {s: sites.count(s) for s in set(sites)}
