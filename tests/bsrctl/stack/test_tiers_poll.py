"""The write-through wait shared by the seeding paths: each tier is polled until it holds
every chunk (a full tier is not asked again), bounded by wait_s."""

from __future__ import annotations

from bsrctl.stack.measure.tiers import _poll_held


def test_each_tier_is_polled_until_full_and_then_left_alone() -> None:
    answers = {"fs": [0, 2, 4], "mooncake": [4]}
    calls: list[str] = []

    def held_now(tier: str) -> int:
        calls.append(tier)
        return answers[tier].pop(0)

    assert _poll_held(4, ("fs", "mooncake"), held_now, 30.0) == {"fs": 4, "mooncake": 4}
    assert calls == ["fs", "mooncake", "fs", "fs"]


def test_past_the_bound_the_partial_counts_come_back() -> None:
    assert _poll_held(4, ("fs",), lambda _t: 3, 0.0) == {"fs": 3}
