"""The adapter cost bench's pure parts: each arm's launch, the rounds' orders, the paired
ratios against the stock cell of the same round, the last line, and a py-spy profile read."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from bsrctl.stack.launch.extensions import SYNC_SCHEDULER, TempoKVLaunch
from bsrctl.tempokv.experiments.adapter_arms import (
    COST_ARMS,
    RECORDER,
    CostCell,
    cost_ratios,
    last_line,
    round_orders,
)
from bsrctl.tempokv.experiments.engine_profile import summarize
from bsrkv.tempokv.live import AdapterSettings


def test_each_round_order_is_balanced() -> None:
    arms = ["stock", "a", "b"]
    orders = round_orders(arms, 6)
    assert orders == [
        ("stock", "a", "b"), ("b", "a", "stock"), ("a", "b", "stock"),
        ("stock", "b", "a"), ("b", "stock", "a"), ("a", "stock", "b"),
    ]  # fmt: skip
    firsts = Counter(o[0] for o in orders)
    assert firsts == {"stock": 2, "a": 2, "b": 2}
    assert round_orders(["stock", "adapter"], 4) == [
        ("stock", "adapter"), ("adapter", "stock"), ("adapter", "stock"), ("stock", "adapter")
    ]  # fmt: skip
    assert round_orders(arms, 2, first=2) == orders[2:4]  # a later launch goes on


def cell(arm: str, r: int, tok_s: float, p95: float, cpu: float = 1.0) -> CostCell:
    return CostCell(arm, 0, r, tok_s, p95, 12, 12, cpu, 0.5, 0.25)


def test_ratios_pair_each_round_with_its_own_stock_cell() -> None:
    cells = [
        cell("stock", 0, 100.0, 2.0), cell("adapter", 0, 99.0, 2.2),
        cell("adapter", 1, 50.0, 4.0), cell("stock", 1, 50.0, 4.0),
        cell("stock", 2, 80.0, 1.0), cell("adapter", 2, 84.0, 1.0),
    ]  # fmt: skip
    (r,) = cost_ratios(cells, seed=0)
    assert r.arm == "adapter" and r.rounds == 3
    assert r.tput.estimate == 1.0  # median of 0.99, 1.0, 1.05
    assert r.p95.estimate == 1.0  # median of 1.1, 1.0, 1.0
    assert (r.tput.lo, r.tput.hi) == (0.99, 1.05)
    assert r.engine_cpu.estimate == 1.0
    assert last_line([r]) == (
        "adapter-cost tput adapter/stock=1 [0.99, 1.05] p95 adapter/stock=1 [1, 1.1]"
    )


def test_the_arms_launch_what_they_say() -> None:
    tk = TempoKVLaunch(AdapterSettings())
    assert tk.scheduler_cls == SYNC_SCHEDULER
    rec = COST_ARMS["recorder"]
    assert TempoKVLaunch(AdapterSettings(), scheduler=rec.scheduler).scheduler_cls == RECORDER
    assert not COST_ARMS["stock"].with_adapter and not COST_ARMS["stock"].tempokv_l1
    assert COST_ARMS["stock-retain"].tempokv_l1 and not COST_ARMS["stock-retain"].with_adapter
    local = COST_ARMS["adapter-local"]
    assert (local.transport, local.trace) == ("record", False)
    # the A/A arm is stock again, a deployment of its own: the bench's noise, nothing else
    assert COST_ARMS["stock-b"] == replace(COST_ARMS["stock"], name="stock-b",
                                           what=COST_ARMS["stock-b"].what)  # fmt: skip
    assert all(COST_ARMS[a].tempokv_l1 for a in COST_ARMS if a not in ("stock", "stock-b"))


def test_a_py_spy_profile_is_read_as_shares(tmp_path: Path) -> None:
    raw = tmp_path / "p.txt"
    raw.write_text(
        "run (vllm/core.py:1);step (vllm/core.py:2);schedule (bsrkv/vllm_ext/s.py:3) 30\n"
        "run (vllm/core.py:1);step (vllm/core.py:2);forward (torch/m.py:9) 60\n"
        "run (vllm/core.py:1);poll (zmq/x.py:4) 10\n"
        "garbage line\n"
    )
    s = summarize(raw, top=2)
    assert s.samples == 100 and s.adapter_share == pytest.approx(0.3)
    assert s.top_self == (
        ("forward (torch/m.py:9)", 0.6),
        ("schedule (bsrkv/vllm_ext/s.py:3)", 0.3),
    )
    assert s.top_total[0] == ("run (vllm/core.py:1)", 1.0)
