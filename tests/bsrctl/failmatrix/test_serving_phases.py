"""The serving cell's phases without a deployment: a Rig whose public methods are replaced
by recorders (the deployment is never started), an injector that records its calls, and a
request that answers at once. The order of the phases and the evidence they record."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.failmatrix import load_matrix, serving
from bsrctl.experiments.failmatrix.injectors import Injector, L1Exhausted
from bsrctl.experiments.failmatrix.serving import ServingRig, fault_placed_checks
from bsrctl.prompts import tokens_sha256
from bsrkv.lmcache_ext.bsr.protocol import GuardFailure

MATRICES = Path(__file__).parents[3] / "matrices"


class Recorder(Injector):
    def isolate(self) -> None:
        CALLS.append("isolate")

    def unisolate(self) -> None:
        CALLS.append("unisolate")

    def arm(self) -> None:
        CALLS.append("arm")

    def strike(self) -> None:
        CALLS.append("strike")

    def recover(self) -> None:
        CALLS.append("recover")


class GuardedClient:
    """The server's bsr.status as far as guard failures go: each read one more failure of
    the books after a restore (what the cell's reads before and after must see as one)."""

    def __init__(self) -> None:
        self.reads = 0

    def status(self) -> Any:
        self.reads += 1
        row = GuardFailure("bsrkv.lmcache_ext.server", "restore_books", "KeyError", self.reads)
        return SimpleNamespace(guard_failures=(row,))


CALLS: list[str] = []
SENT: list[tuple[int, int]] = []
SNAP = {"recovered": 0, "counters": {"lookup_hits": 0}, "outcomes": [], "markers": [],
        "reads": {"fs": 0}, "fs": {}}  # fmt: skip


class FakeRig(ServingRig):
    """ServingRig over recorders: nothing is launched."""

    def __init__(self, spec: Any) -> None:  # no deployment
        self.spec, self.canonical = spec, {}
        self.deployment = SimpleNamespace(kind="serving")  # launched: attached is False
        self._stack = self._client = None
        self.stack = SimpleNamespace(complete=self._complete)
        self.client = GuardedClient()
        self.snaps = 0

    def _complete(self, ids: list[int], max_tokens: int) -> Any:
        SENT.append((len(ids), max_tokens))  # from the request's thread: not in CALLS' order
        return SimpleNamespace(cached_tokens=0, output_token_ids=(1, 2, 3))

    def prompt(self, name: str, tokens: int | None = None) -> list[int]:
        return [7] * (tokens or self.spec.workload.prompt_tokens)

    def ensure_up(self) -> None:
        CALLS.append("ensure_up")

    def seed(self, ids: list[int], tiers: tuple[str, ...]) -> dict[str, Any]:
        CALLS.append(f"seed {','.join(tiers)}")
        return {"complete": True, "reason": "", "tiers": list(tiers)}

    def fs_prefix_tokens(self, ids: list[int]) -> int:
        return 3840

    def snapshot(self) -> dict[str, Any]:
        self.snaps += 1
        CALLS.append(f"snapshot {self.snaps}")
        after = {"counters": {"lookup_hits": 2}, "reads": {"fs": 5}, "recovered": 1}
        return {**SNAP, **(after if self.snaps == 2 else {})}

    def reconnect(self) -> Any:
        CALLS.append("reconnect")

    def follow_up(self) -> tuple[bool, str]:
        CALLS.append("follow_up")
        return True, "follow-up answered"

    def markers_active(self) -> int | None:
        return 0

    def audit(self, stopped: list[int]) -> tuple[list[int], dict]:
        CALLS.append("audit")
        return [], {"vllm": True, "lmcache": True}


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> FakeRig:
    spec, _ = load_matrix(MATRICES / "cpu.yaml")
    monkeypatch.setitem(serving.INJECTORS, "window_timeout", Recorder)
    CALLS.clear()
    SENT.clear()
    r = FakeRig(spec)
    r.canonical = {"window-timeout": (1, 2, 3)}
    return r


def test_the_phases_run_in_order_and_record_the_cell(rig: FakeRig) -> None:
    cell = next(c for c in rig.spec.cells if c.id == "window-timeout")
    point = rig.run_cell(cell, after_seed=lambda: CALLS.append("after_seed"))
    assert CALLS == ["ensure_up", "seed fs", "after_seed", "isolate", "arm", "snapshot 1",
                     "strike", "snapshot 2", "recover", "unisolate", "follow_up",
                     "audit"]  # fmt: skip
    assert SENT == [(4000, 8)]  # one request: the cell's prompt, the workload's max_tokens
    m = point.measures
    assert (m["tokens"], m["window_chunks"], m["cached_tokens"]) == (4000, 4, 0)
    assert (m["expected_cached_tokens"], m["lower_tier_prefix_tokens_at_request"]) == (0, 3840)
    assert m["output_sha256"] == m["canonical_sha256"] == tokens_sha256((1, 2, 3))
    assert (m["recovered_delta"], m["lookups_delta"]) == (1, {"lookup_hits": 2})
    assert m["seed"] == {"complete": True, "reason": "", "tiers": ["fs"]}
    assert "flood_seeds" not in m and m["l1_capacity_bytes"] is None
    names = [c.name for c in point.checks]
    assert "fault_injected" not in names and "post_request_health" in names
    assert point.extra == {"fault_notes": {}, "marker_events": []}
    # the server's guards read before the cell and after it: the one failure in between
    (c,) = [c for c in point.checks if c.name == "extensions_healthy"]
    assert (c.verdict, c.detail) == (
        Verdict.FAIL,
        "extension degraded to stock: LMCache "
        "server: bsrkv.lmcache_ext.server [restore_books] KeyError x1",
    )
    assert rig.client.reads == 2 and names[-1] == "extensions_healthy"


def test_an_unseeded_cell_places_no_fault(rig: FakeRig, monkeypatch: pytest.MonkeyPatch) -> None:
    short = {"complete": False, "reason": "setup: fs 3/15 chunks", "tiers": ["fs"]}
    monkeypatch.setattr(rig, "seed", lambda ids, tiers: short)
    cell = next(c for c in rig.spec.cells if c.id == "window-timeout")
    point = rig.run_cell(cell)
    assert CALLS == ["ensure_up"] and SENT == []
    assert [(c.name, c.verdict, c.detail) for c in point.checks] == [
        ("setup_seeded", Verdict.UNKNOWN, "setup: fs 3/15 chunks"),
        (
            "extensions_healthy",
            Verdict.FAIL,
            "extension degraded to stock: LMCache server: "
            "bsrkv.lmcache_ext.server [restore_books] KeyError x1",
        ),
    ]
    assert point.measures["seed"] == short


def test_fault_placed_checks() -> None:
    spec, _ = load_matrix(MATRICES / "cpu.yaml")
    cell = next(c for c in spec.cells if c.id == "l1-exhausted")
    inj = L1Exhausted(None, cell, [], spec.settings())  # type: ignore[arg-type]
    (failed,) = fault_placed_checks(cell, inj, "OSError: gone")
    assert (failed.name, failed.verdict, failed.detail) == (
        "fault_injected", Verdict.UNKNOWN, "strike failed: OSError: gone")  # fmt: skip
    inj.notes["flood"] = {"l1_used_max_bytes_while_held": 80, "l1_capacity_bytes": 100}
    (low,) = fault_placed_checks(cell, inj, "")
    assert low.verdict == Verdict.UNKNOWN and "NOT exhausted" in low.detail
    inj.notes["flood"]["l1_used_max_bytes_while_held"] = 90
    (full,) = fault_placed_checks(cell, inj, "")
    assert full.verdict == Verdict.PASS and full.detail == (
        "L1 used at most 90 of 100 bytes while window 1 was held (exhausted; threshold 90%)"
    )
    other = next(c for c in spec.cells if c.id == "window-timeout")
    assert fault_placed_checks(other, Injector(None, other, [], spec.settings()), "") == []  # type: ignore[arg-type]
