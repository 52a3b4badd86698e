from hypothesis import given
from hypothesis import strategies as st

from bsrctl.evidence import Verdict, exit_code, merge
from bsrctl.evidence.verdict import Check, Point, check

verdicts = st.lists(st.sampled_from(list(Verdict)))


def test_merge_orders_fail_over_unknown_over_pass() -> None:
    assert merge([Verdict.PASS, Verdict.UNKNOWN, Verdict.FAIL]) == Verdict.FAIL
    assert merge([Verdict.PASS, Verdict.UNKNOWN]) == Verdict.UNKNOWN
    assert merge([Verdict.PASS, Verdict.PASS]) == Verdict.PASS


def test_missing_evidence_is_never_pass() -> None:
    assert merge([]) == Verdict.UNKNOWN
    assert Point("p", {}, {}, ()).verdict == Verdict.UNKNOWN


@given(verdicts, verdicts)
def test_merge_is_associative_and_order_free(a: list[Verdict], b: list[Verdict]) -> None:
    if a and b:
        assert merge(a + b) == merge([merge(a), merge(b)])
    assert merge(a + b) == merge(b + a)


def test_exit_codes() -> None:
    assert [exit_code(v) for v in (Verdict.PASS, Verdict.FAIL, Verdict.UNKNOWN)] == [0, 1, 3]


def test_check_maps_none_to_unknown() -> None:
    assert check("x", None).verdict == Verdict.UNKNOWN
    assert check("x", True).verdict == Verdict.PASS
    assert check("x", False, "why").to_json() == {"name": "x", "verdict": "FAIL", "detail": "why"}


def test_point_json_carries_merged_verdict() -> None:
    p = Point("a", {"w": 1}, {"m": 2}, (Check("c1", Verdict.PASS), Check("c2", Verdict.FAIL)))
    doc = p.to_json()
    assert doc["verdict"] == "FAIL"
    assert [c["name"] for c in doc["checks"]] == ["c1", "c2"]
