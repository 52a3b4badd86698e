"""The suite's Hypothesis profile (tests/conftest.py): a property test draws the same examples
on every run and machine, its own @settings(max_examples=...) included; one whose @settings
re-randomize (derandomize=False, a database) or time it (a deadline, a health-check list without
too_slow) is named, and stops collection under `make test`."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import randomized  # noqa: E402

FIXTURE, SLOW = HealthCheck.function_scoped_fixture, HealthCheck.too_slow


def drawn(test_settings: settings) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []

    @test_settings
    @given(st.integers(), st.text(max_size=8))
    def prop(n: int, s: str) -> None:
        seen.append((n, s))

    prop()
    return seen


def test_the_suite_profile_is_loaded_and_derandomized() -> None:
    assert settings.get_current_profile_name() == "same"
    assert (settings.default.derandomize, settings.default.database) == (True, None)
    assert settings.default.deadline is None


def test_a_tests_own_max_examples_inherits_derandomize_and_draws_the_same_examples() -> None:
    own = settings(max_examples=30)
    assert own.derandomize is True and own.database is None
    first, second = drawn(own), drawn(settings(max_examples=30))
    assert len(first) >= 30 and first == second


def fake_item(nodeid: str, test_settings: settings | None) -> SimpleNamespace:
    @given(st.integers())
    def prop(n: int) -> None: ...

    if test_settings is not None:
        prop = test_settings(prop)
    return SimpleNamespace(nodeid=nodeid, obj=prop)


def test_a_test_whose_settings_re_randomize_is_named() -> None:
    items = [
        fake_item("a::inherits", None),
        fake_item("b::own_count", settings(max_examples=5)),
        fake_item("c::random", settings(derandomize=False)),
        fake_item("d::database", settings(database=InMemoryExampleDatabase())),
        SimpleNamespace(nodeid="e::not_a_property", obj=lambda: None),
        fake_item("f::deadline", settings(deadline=200)),
        fake_item("g::own_checks", settings(suppress_health_check=[FIXTURE])),
        fake_item("h::own_checks_kept", settings(suppress_health_check=[FIXTURE, SLOW])),
    ]
    named = ["c::random", "d::database", "f::deadline", "g::own_checks"]
    assert randomized(items) == named  # type: ignore[arg-type]
