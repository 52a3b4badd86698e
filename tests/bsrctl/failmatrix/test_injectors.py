"""Injectors read W and the window timeout from the deployment's restore settings (the spec's
``restore:`` and ``workload.window_chunks``), handed to them by the rig: neither the stack
spec nor the stack holds them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from bsrctl.experiments.failmatrix import load_matrix
from bsrctl.experiments.failmatrix.injectors import (
    SLOW_TASKS,
    LoadFailsAlways,
    MasterRestarted,
    ObjectDamaged,
    SlowTier,
    WholePlan,
    WindowTimeout,
    clear_rules,
)
from bsrctl.stack.measure.tiers import chunk_hashes_hex

MATRICES = Path(__file__).parents[3] / "matrices"


def fake_stack(tmp_path: Path):
    spec, _ = load_matrix(MATRICES / "cpu.yaml")
    return spec, SimpleNamespace(
        spec=spec.stack,
        dir=tmp_path,
        fs_l2_dir=tmp_path / "l2-fs",
        fault_control=lambda tier: tmp_path / f"faults-{tier}.json",
        lmcache_status=lambda: {"storage_manager": {"l2_adapters": []}},
    )


def rules(tmp_path: Path, tier: str) -> list[dict]:
    return json.loads((tmp_path / f"faults-{tier}.json").read_text())["rules"]


def test_window_timeout_holds_window_k_past_the_restore_window_timeout(tmp_path: Path) -> None:
    spec, stack = fake_stack(tmp_path)
    cell = next(c for c in spec.cells if c.id == "window-timeout")
    inj = WindowTimeout(stack, cell, [], spec.settings())
    inj.arm()
    rule = {"action": "delay", "tasks": [1], "delay_s": 8.0 + 3.0, "limit": 1}
    assert rules(tmp_path, "fs") == [rule]
    assert inj.notes["rule"] == {"tier": "fs", **rule}
    clear_rules(stack)
    assert (rules(tmp_path, "fs"), rules(tmp_path, "mooncake")) == ([], [])


def test_the_damaged_object_is_window_ks_first_chunk(tmp_path: Path) -> None:
    spec, stack = fake_stack(tmp_path)
    cell = next(c for c in spec.cells if c.id == "object-corrupted")  # window 2, W = 4
    ids = list(range(4000))
    hashes = chunk_hashes_hex(ids, 256, 15)
    (tmp_path / "l2-fs").mkdir()
    for h in hashes:
        (tmp_path / "l2-fs" / f"k@{h}.data").write_bytes(b"\0" * 64)
    inj = ObjectDamaged(stack, cell, ids, spec.settings())
    assert inj.window_object().name == f"k@{hashes[8]}.data"
    inj.arm()
    assert inj.notes["object"] == {
        "file": f"k@{hashes[8]}.data",
        "how": "4096 bytes flipped at offset 32",
    }
    assert (tmp_path / "l2-fs" / f"k@{hashes[8]}.data").read_bytes() == b"\0" * 32 + b"\xff" * 32
    inj.recover()  # the object as it was, and nothing else in the folder
    assert (tmp_path / "l2-fs" / f"k@{hashes[8]}.data").read_bytes() == b"\0" * 64
    assert sorted(p.name for p in (tmp_path / "l2-fs").iterdir()) == sorted(
        f"k@{h}.data" for h in hashes
    )


def test_load_fails_always_drops_every_load_of_the_source_tier(tmp_path: Path) -> None:
    spec, stack = fake_stack(tmp_path)
    cell = next(c for c in spec.cells if c.id == "load-fails-always")
    inj = LoadFailsAlways(stack, cell, [], spec.settings())
    inj.arm()
    assert rules(tmp_path, "fs") == [{"action": "drop", "phase": "load"}]  # no limit, no task
    assert inj.notes["rule"] == {"tier": "fs", "action": "drop", "phase": "load"}


def test_slow_tier_holds_every_load_from_window_k_past_the_timeout(tmp_path: Path) -> None:
    spec, stack = fake_stack(tmp_path)
    cell = next(c for c in spec.cells if c.id == "slow-tier")
    SlowTier(stack, cell, [], spec.settings()).arm()
    tasks = list(range(1, 1 + SLOW_TASKS))
    assert rules(tmp_path, "fs") == [{"action": "delay", "tasks": tasks, "delay_s": 12.0}]
    SlowTier(stack, cell.model_copy(update={"delay_s": 20.0}), [], spec.settings()).arm()
    assert rules(tmp_path, "fs")[0]["delay_s"] == 20.0


def test_whole_plan_sets_w_0_for_the_request_and_gives_w_b_back(tmp_path: Path) -> None:
    spec, stack = fake_stack(tmp_path)
    cell = next(c for c in spec.cells if c.id == "whole-plan-past-l1")
    calls: list[tuple[int, int, bool]] = []
    inj = WholePlan(stack, cell, [], spec.settings())
    inj.deployment = SimpleNamespace(configure=lambda w, b, rb: calls.append((w, b, rb)))
    inj.arm()
    inj.recover()
    assert calls == [(0, 0, True), (4, 4, True)]  # the cell keeps the oracle on
    assert inj.notes == {"window_chunks": 0, "window_chunks_after": 4}


class FakeMooncake:
    def __init__(self, remounts: bool) -> None:
        self.master = SimpleNamespace(pid=100)
        self.node = SimpleNamespace(pid=200)
        self.remounts, self.log = remounts, []

    def start_master(self) -> float:
        self.log.append(("restart master", self.master.pid))
        self.master = SimpleNamespace(pid=self.master.pid + 1)
        return 0.5

    def node_healthy(self) -> bool:
        return self.remounts

    def start_node(self) -> float:
        self.log.append(("restart node", self.node.pid))
        self.node = SimpleNamespace(pid=201)
        return 0.5


def test_master_restarted_replaces_only_the_master_and_never_forces_the_node(
    tmp_path: Path, monkeypatch
) -> None:
    import bsrctl.experiments.failmatrix.injectors as injectors

    monkeypatch.setattr(injectors, "wait_until", lambda f, t: f())
    spec, stack = fake_stack(tmp_path)
    cell = next(c for c in spec.cells if c.id == "mooncake-master-restarted")
    for remounts in (True, False):
        stack.mooncake, stack.save_state = FakeMooncake(remounts), lambda: None
        inj = MasterRestarted(stack, cell, [], spec.settings())
        inj.arm()
        assert stack.mooncake.log == [("restart master", 100)]  # the node kept running
        assert inj.stopped_pids == [100]
        r = inj.notes["restarted"]
        assert (r["old_master"], r["new_master"], r["node_pid"]) == (100, 101, 200)
        assert r["node_mounted_again"] is remounts
        inj.recover()  # the node is restarted only when it did not mount on the new master
        assert stack.mooncake.log[1:] == ([] if remounts else [("restart node", 200)])
