"""The live serving workload: seeded arrivals as vLLM's benchmark draws them, conversations
that reuse a document across turns, goodput within a TTFT SLO; exact values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from bsrctl.prompts import prompt_ids
from bsrctl.tempokv.experiments.crosscheck import CrossCheckUnknown, sim_spec
from bsrctl.tempokv.experiments.serving import _prompts, goodput_measures
from bsrctl.tempokv.serving_workload import (
    ArrivalSpec,
    Goodput,
    Turn,
    arrival_offsets,
    conversation_plan,
    goodput,
    question_salts,
)
from bsrctl.tempokv.spec import ServingRun, TempoKVSpec

POISSON = ArrivalSpec(process="poisson")


def test_fixed_arrivals_are_the_interval_apart() -> None:
    assert arrival_offsets(4, 0.25, ArrivalSpec()) == (0.0, 0.25, 0.5, 0.75)
    assert arrival_offsets(3, 0.0, POISSON) == (0.0, 0.0, 0.0)  # all at once, as rate inf


def test_poisson_arrivals_are_seeded_and_end_where_vllm_ends_them() -> None:
    a = arrival_offsets(5, 0.5, POISSON)
    assert a == arrival_offsets(5, 0.5, ArrivalSpec(process="poisson", seed=0))
    assert [round(x, 6) for x in a] == [0.748182, 1.870123, 1.891918, 1.894415, 2.5]
    b = arrival_offsets(5, 0.5, ArrivalSpec(process="poisson", seed=1))
    assert [round(x, 6) for x in b] == [0.370587, 0.477116, 2.333607, 2.460158, 2.5]
    bursty = arrival_offsets(4, 0.5, ArrivalSpec(process="poisson", burstiness=0.5))
    assert [round(x, 6) for x in bursty] == [0.482287, 0.484145, 1.574553, 2.0]


@given(
    st.integers(1, 200),
    st.floats(0.001, 10.0),
    st.floats(0.05, 50.0),
    st.integers(0, 2**31),
)
def test_poisson_offsets_rise_to_n_intervals(n: int, interval: float, b: float, seed: int) -> None:
    got = arrival_offsets(n, interval, ArrivalSpec(process="poisson", burstiness=b, seed=seed))
    assert len(got) == n and all(x <= y for x, y in zip(got, got[1:], strict=False))
    assert got[0] >= 0.0 and math.isclose(got[-1], n * interval, rel_tol=1e-9)


def test_a_conversation_comes_back_one_round_later() -> None:
    plan = conversation_plan(7, 2, 3)  # ceil(7 / 3) = 3 conversations over 2 documents
    assert [(t.conversation, t.doc, t.turn) for t in plan] == [
        (0, 0, 0), (1, 1, 0), (2, 0, 0), (0, 0, 1), (1, 1, 1), (2, 0, 1), (0, 0, 2),
    ]  # fmt: skip
    assert question_salts(5, plan[6]) == ("tk-q-5-0", "tk-q-5-0-t1", "tk-q-5-0-t2")
    one = conversation_plan(5, 2, 1)
    assert one == tuple(Turn(i, i, i % 2, 0) for i in range(5))
    assert [question_salts(5, t) for t in one] == [(f"tk-q-5-{i}",) for i in range(5)]


def test_one_turn_prompts_are_the_document_and_one_question() -> None:
    run = ServingRun(documents_tokens=[300, 400], num_requests=3, question_tokens=8)
    docs, reqs = _prompts(run, 1000, 5)
    assert [len(d) for d in docs] == [300, 400]
    assert reqs == [docs[i % 2] + prompt_ids(f"tk-q-5-{i}", 8, 1000) for i in range(3)]


def test_later_turns_carry_the_conversation_so_far() -> None:
    run = ServingRun(documents_tokens=[300], num_requests=4, question_tokens=8, turns=2)
    docs, reqs = _prompts(run, 1000, 5)
    q = {s: prompt_ids(s, 8, 1000) for s in ("tk-q-5-0", "tk-q-5-1", "tk-q-5-0-t1", "tk-q-5-1-t1")}
    assert reqs == [
        docs[0] + q["tk-q-5-0"],
        docs[0] + q["tk-q-5-1"],
        docs[0] + q["tk-q-5-0"] + q["tk-q-5-0-t1"],
        docs[0] + q["tk-q-5-1"] + q["tk-q-5-1-t1"],
    ]


def test_goodput_counts_finished_requests_within_the_slo() -> None:
    g = goodput([0.1, 0.5, None, 0.3], 0.3, 2.0)
    assert (g.good, g.requests, g.share, g.req_s) == (2, 4, 0.5, 1.0)
    assert math.isnan(goodput([], 0.3, 1.0).share)


class _R:
    def __init__(self, sent: float, first: float) -> None:
        self.sent_s, self.first_token_s = sent, first


def test_goodput_measures_only_with_an_slo() -> None:
    results = [_R(0.0, 0.2), None, _R(1.0, 1.5)]
    assert goodput_measures(results, None, 2.0) is None
    assert goodput_measures(results, 0.25, 2.0) == Goodput(0.25, 1, 3, round(1 / 3, 6), 0.5)


def test_turns_that_overflow_the_model_length_name_the_fields() -> None:
    with pytest.raises(ValidationError, match=r"8193 tokens > stack.vllm.max_model_len 8192"):
        ServingRun(documents_tokens=[8000], question_tokens=32, turns=5, max_tokens=33)
    with pytest.raises(ValidationError, match="process"):
        ServingRun.model_validate({"arrivals": {"process": "bursty"}})
    with pytest.raises(ValidationError, match="extra"):
        ServingRun.model_validate({"arrivals": {"rate": 3}})


def test_the_sim_cross_check_refuses_what_it_cannot_replay() -> None:
    base = {"models": [{"name": "llama-3.1-8b"}],
            "experiment": {"kind": "policies", "cache_ratios": [1.0]}}  # fmt: skip
    for serving, named in (
        ({"arrivals": {"process": "poisson"}}, "serving.arrivals.process poisson"),
        ({"turns": 2}, "serving.turns 2"),
    ):
        spec = TempoKVSpec.model_validate({**base, "serving": serving})
        with pytest.raises(CrossCheckUnknown, match=named):
            sim_spec(spec, None)  # type: ignore[arg-type]
