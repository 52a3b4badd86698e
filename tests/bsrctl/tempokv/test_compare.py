from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bsrctl.tempokv.experiments.compare import compare, ordering


def rows(**c: float) -> dict[str, dict[str, float]]:
    return {p: {"c": v} for p, v in c.items()}


def test_ordering_lowest_first_ties_by_name() -> None:
    assert ordering(rows(demand=3.0, immediate=1.0, tempokv=1.0), "c") == (
        "immediate", "tempokv", "demand")  # fmt: skip


def test_discordant_pairs_and_tau() -> None:
    left = rows(demand=3.0, immediate=2.0, tempokv=1.0)
    right = rows(demand=3.0, immediate=1.0, tempokv=2.0, oracle=0.5)  # oracle: sim only
    a = compare(left, right, "c")
    assert a.left == ("tempokv", "immediate", "demand")
    assert a.right == ("immediate", "tempokv", "demand")
    assert a.discordant == (("tempokv", "immediate"),)
    assert a.ties == 0 and a.tau == round(1 - 2 / 3, 6)


def test_ties_neither_agree_nor_disagree() -> None:
    left = rows(demand=3.0, immediate=2.0, tempokv=1.0)
    right = rows(demand=2.0, immediate=2.0, tempokv=2.0)  # the sim cannot tell them apart
    a = compare(left, right, "c")
    assert a.discordant == () and a.ties == 3 and a.tau == 0.0


@given(st.dictionaries(st.sampled_from("abcdefg"), st.floats(0, 10), min_size=2))
def test_a_run_agrees_with_itself_and_reversal_is_minus_one(c: dict[str, float]) -> None:
    r = {p: {"c": float(i)} for i, p in enumerate(sorted(c, key=lambda p: (c[p], p)))}
    assert compare(r, r, "c").tau == 1.0
    rev = {p: {"c": float(i)} for i, p in enumerate(reversed(ordering(r, "c")))}
    assert compare(r, rev, "c").tau == -1.0
