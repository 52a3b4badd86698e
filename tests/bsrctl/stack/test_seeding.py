"""The one seeding loop (serving target and failure matrix): cold requests until every
relied tier holds every whole chunk, at most SEED_ATTEMPTS; L1 and vLLM forget before every
attempt but the first (and the first too when asked)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest

from bsrctl.stack.measure import seeding
from bsrctl.stack.measure.seeding import SEED_ATTEMPTS, SeedAttempt, TierSeed, seed_tiers
from bsrctl.stack.measure.tiers import HIDE_LOOKUPS
from bsrkv.lmcache_ext.bsr.protocol import ForgetReply

IDS = list(range(1000))  # 3 whole chunks of 256 tokens


@dataclass
class FakeDeployment:
    """Stack and client at once; records every call in order."""

    held: list[dict[str, int]]  # what the tiers hold after each cold request
    calls: list[str] = field(default_factory=list)
    control_dir: Path | None = None  # where the tiers' fault control files are

    def fault_tiers(self) -> tuple[str, ...]:
        return ("fs", "mooncake")

    def fault_control(self, tier: str) -> Path:
        assert self.control_dir is not None
        return self.control_dir / f"faults-{tier}.json"

    def rules(self) -> dict[str, list]:
        """Each tier's armed rules, now."""
        out = {}
        for t in self.fault_tiers():
            path = self.fault_control(t)
            out[t] = json.loads(path.read_text())["rules"] if path.exists() else []
        return out

    def forget(self, wait_s: float) -> ForgetReply:
        self.calls.append(f"forget {wait_s}")
        return ForgetReply(
            l1_used_bytes_before=9, l1_used_bytes_after=7, force=False, waited_s=wait_s
        )

    def forget_local(self) -> None:
        self.calls.append("forget_local")

    def complete(self, ids: list[int], max_tokens: int) -> SimpleNamespace:
        hidden = sorted(t for t, r in self.rules().items() if r == HIDE_LOOKUPS)
        self.calls.append(
            f"complete {len(ids)} {max_tokens}" + (f" hidden {hidden}" if hidden else "")
        )
        return SimpleNamespace(cached_tokens=256 * len([c for c in self.calls if "complete" in c]))


@pytest.fixture
def deployment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    def make(held: list[dict[str, int]]) -> FakeDeployment:
        dep = FakeDeployment(held, control_dir=tmp_path)

        def wait(stack, ids, chunk, tiers, wait_s, ranks):
            dep.calls.append(f"wait {chunk} {tiers} {wait_s} {ranks}")
            return dict(dep.held.pop(0))

        monkeypatch.setattr(seeding, "wait_tiers_hold", wait)
        return dep

    return make


def seed(dep: FakeDeployment, tiers: tuple[str, ...], forget_first: bool, **kw) -> TierSeed:
    return seed_tiers(
        dep, dep, IDS, chunk_tokens=256, tiers=tiers, max_tokens=8,
        forget_first=forget_first, forget_wait_s=3.0, **kw,
    )  # fmt: skip


def test_a_tier_short_after_the_first_request_gets_one_more(deployment) -> None:
    dep = deployment([{"fs": 2}, {"fs": 3}])
    s = seed(dep, ("fs",), forget_first=False, ranks=2)
    assert dep.calls == [
        "complete 1000 8", "wait 256 ('fs',) 20.0 2",
        "forget 3.0", "forget_local", "complete 1000 8 hidden ['mooncake']",
        "wait 256 ('fs',) 20.0 2",
    ]  # fmt: skip
    assert s.attempts == (
        SeedAttempt(256, {"fs": 2}, None),
        SeedAttempt(512, {"fs": 3}, 7, ("mooncake",)),
    )
    assert dep.rules() == {"fs": [], "mooncake": []}  # the retry's rules are gone after it
    assert (s.chunks, s.held, s.short, s.complete) == (3, {"fs": 3}, {}, True)


def test_every_relied_tier_must_hold_all_and_attempts_are_bounded(deployment) -> None:
    dep = deployment([{"fs": 3, "mooncake": 1}, {"fs": 3, "mooncake": 2}])
    s = seed(dep, ("fs", "mooncake"), forget_first=True)
    assert SEED_ATTEMPTS == 2 and len(s.attempts) == 2
    assert [c for c in dep.calls if c.startswith("forget")] == ["forget 3.0", "forget_local"] * 2
    assert s.attempts[0] == SeedAttempt(256, {"fs": 3, "mooncake": 1}, 7)
    assert (s.held, s.short, s.complete) == ({"fs": 3, "mooncake": 2}, {"mooncake": 2}, False)


def test_a_full_first_attempt_is_the_only_one(deployment) -> None:
    dep = deployment([{"mooncake": 3}])
    s = seed(dep, ("mooncake",), forget_first=False)
    assert dep.calls == ["complete 1000 8", "wait 256 ('mooncake',) 20.0 1"]
    assert s.attempts == (SeedAttempt(256, {"mooncake": 3}, None),)


def test_the_serving_target_records_its_one_tier(deployment, tmp_path) -> None:
    from bsrctl.specs import TargetSpec
    from bsrctl.stack.contracts.measures import SeedRecord
    from bsrctl.stack.selector import make_target

    target = make_target(TargetSpec(), tmp_path)
    assert (target.kind, type(target.deployment).__name__) == ("serving", "LaunchedDeployment")
    dep = deployment([{"fs": 2}, {"fs": 3}])
    target.stack = target.client = dep
    rec = target._seed(IDS)
    assert rec == SeedRecord(
        tier="fs",
        chunks=3,
        held_chunks=3,
        attempts=(
            {"cached_tokens": 256, "held_chunks": 2, "hidden": []},
            {"cached_tokens": 512, "held_chunks": 3, "hidden": ["mooncake"]},
        ),
        seed_s=rec.seed_s,
    )
    assert dep.calls[:2] == ["complete 1000 16", "wait 256 ('fs',) 20.0 1"]


def test_the_failmatrix_rig_records_every_tier(deployment, tmp_path) -> None:
    from pathlib import Path

    from bsrctl.experiments.failmatrix import ServingRig, load_matrix

    spec, _ = load_matrix(Path(__file__).parents[3] / "matrices" / "cpu.yaml")
    rig = ServingRig(spec, tmp_path, lambda _: None)
    rig.stack.dir.mkdir(parents=True)
    dep = deployment([{"fs": 15}, {"fs": 15}])
    rig.stack, rig.client = dep, dep
    dep.fault_control = lambda tier: tmp_path / f"faults-{tier}.json"
    ids = list(range(4000))
    (tmp_path / "faults-fs.json").write_text('{"rules": [{"action": "drop"}]}')
    out = rig.seed(ids, ("fs",))
    assert out == {
        "complete": True,
        "reason": "",
        "tiers": ["fs"],
        "chunks": 15,
        "held_chunks": {"fs": 15, "mooncake": 0},
        "attempts": [
            {"l1_used_before": 7, "cached_tokens": 256, "fs": 15, "mooncake": 0, "hidden": []}
        ],
        "seed_s": out["seed_s"],
        "l1_used_after_forget": 7,
    }
    assert dep.calls == [
        "forget 3.0", "forget_local", "complete 4000 8", "wait 256 ('fs',) 20.0 1",
        "forget 3.0", "forget_local",
    ]  # fmt: skip
    assert (tmp_path / "faults-fs.json").read_text() == '{"rules": []}'
    short = deployment([{"fs": 15, "mooncake": 3}, {"fs": 15, "mooncake": 4}])
    rig.stack, rig.client = short, short
    short.fault_control = dep.fault_control
    out = rig.seed(ids, ("fs", "mooncake"))
    assert out["complete"] is False
    assert out["reason"] == (
        "setup: after 2 seeding attempt(s) tier(s) hold mooncake 4/15 chunks of the seeded "
        "prefix: the fault was not injected"
    )
    assert [a["mooncake"] for a in out["attempts"]] == [3, 4]


def test_a_retry_hides_every_tier_but_the_short_ones_and_puts_the_armed_rules_back(
    deployment,
) -> None:
    """Mooncake short after the first request while FS holds everything: without hiding FS,
    the retry would be served from FS and store nothing (CI: mooncake 6/15 after both). The
    short tier itself stays visible: its own prefix serves, vLLM computes the rest, and only
    that passes through L1 (a prefix longer than L1 is stored in parts)."""
    dep = deployment([{"mooncake": 1}, {"mooncake": 3}])
    armed = [{"action": "delay", "delay_s": 1.0, "tasks": [1], "limit": 1}]
    dep.fault_control("mooncake").write_text(json.dumps({"rules": armed}))
    s = seed(dep, ("mooncake",), forget_first=True)
    assert [c for c in dep.calls if c.startswith("complete")] == [
        "complete 1000 8",
        "complete 1000 8 hidden ['fs']",
    ]
    assert [a.hidden for a in s.attempts] == [(), ("fs",)]
    assert (s.held, s.complete) == ({"mooncake": 3}, True)
    assert dep.rules() == {"fs": [], "mooncake": armed}


def test_with_two_relied_tiers_only_the_complete_one_is_hidden(deployment) -> None:
    dep = deployment([{"fs": 3, "mooncake": 2}, {"fs": 3, "mooncake": 3}])
    s = seed(dep, ("fs", "mooncake"), forget_first=False)
    assert [a.hidden for a in s.attempts] == [(), ("fs",)]
    assert s.complete
