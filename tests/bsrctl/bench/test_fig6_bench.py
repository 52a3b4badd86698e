"""The Figure 6 bench's pure parts: the arms' order per repeat and the per-rate summary."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

BENCH = Path(__file__).resolve().parents[3] / "bench" / "tempokv"
_path = BENCH / "fig6_serving.py"
_spec = importlib.util.spec_from_file_location("fig6_serving", _path)
assert _spec is not None and _spec.loader is not None
fig6 = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fig6  # dataclasses look their module up
_spec.loader.exec_module(fig6)

from bsrctl.stack.launch.extensions import L1Options  # noqa: E402


def test_arm_orders_alternate() -> None:
    ab, ba = ("lmcache", "tempokv"), ("tempokv", "lmcache")
    assert fig6.arm_orders(1) == [ab]
    assert fig6.arm_orders(4) == [ab, ba, ab, ba]


@given(st.integers(min_value=1, max_value=40))
def test_every_arm_leads_as_often_as_the_other_up_to_one(repeats: int) -> None:
    orders = fig6.arm_orders(repeats)
    assert len(orders) == repeats
    assert all(sorted(o) == sorted(fig6.ARMS) for o in orders)
    firsts = [o[0] for o in orders]
    assert firsts.count("lmcache") - firsts.count("tempokv") in (0, 1)


def test_spread_median_min_max() -> None:
    assert fig6.spread([1.2, 0.5, 0.9]) == fig6.Spread(0.9, 0.5, 1.2)
    assert fig6.spread([2.0, 1.0]) == fig6.Spread(1.5, 1.0, 2.0)
    assert all(math.isnan(x) for x in vars(fig6.spread([])).values())


def test_table_rows_take_medians_and_ratio_ranges() -> None:
    def cell(p95: float, tok: float, same: int = 10) -> object:
        return fig6.Cell(p95, tok, same, 10, "")

    cells = [
        {"lmcache": {2.0: cell(1.0, 100.0)}, "tempokv": {2.0: cell(0.5, 150.0)}},
        {"lmcache": {2.0: cell(2.0, 50.0)}, "tempokv": {2.0: cell(2.0, 50.0, 9)}},
        {"lmcache": {2.0: cell(1.0, 80.0)}, "tempokv": {2.0: cell(0.8, 100.0)}},
    ]
    rows = fig6.table([2.0], cells)
    assert rows[2] == (
        "| 2 | 1.000 | 0.800 | 80.0 | 100.0 | 0.800 [0.500–1.000] "
        "| 1.250 [1.000–1.500] | 30/30, 29/30 |"
    )


def test_baseline_stack_differs_only_by_the_tempokv_launch(tmp_path: Path) -> None:
    from bsrctl.tempokv.experiments.serving import deployment_for
    from bsrctl.tempokv.spec import TempoKVSpec

    spec = TempoKVSpec.model_validate(yaml.safe_load(fig6.DEFAULT_SPEC.read_text()))
    tk = deployment_for(spec, tmp_path / "tk")[0].stack
    lm = deployment_for(spec, tmp_path / "lm", with_adapter=False)[0].stack
    assert tk.extensions is not None and lm.extensions is not None
    assert tk.extensions.tempokv is not None
    assert tk.extensions.tempokv.scheduler_cls == "bsrkv.vllm_ext.scheduler.TempoKVScheduler"
    assert lm.extensions.tempokv is None
    assert lm.extensions.server_module == tk.extensions.server_module
    assert lm.extensions.l2_device == tk.extensions.l2_device
    assert lm.spec == tk.spec


def test_the_adapter_arm_runs_in_the_order_and_gets_its_own_table() -> None:
    arms = (*fig6.ARMS, fig6.ADAPTER_ARM)
    assert fig6.arm_orders(2, arms) == [arms, arms[::-1]]
    cells = [
        {"lmcache": {4.0: fig6.Cell(1.0, 100.0, 10, 10, "")},
         "tempokv": {4.0: fig6.Cell(2.0, 80.0, 10, 10, "")},
         "adapter": {4.0: fig6.Cell(1.5, 90.0, 10, 10, "")}},
    ]  # fmt: skip
    rows = fig6.table([4.0], cells, fig6.ADAPTER_ARM)
    assert rows[0].startswith("| rate rps | LMCache p95 TTFT s | adapter only p95 TTFT s |")
    assert rows[2] == (
        "| 4 | 1.000 | 1.500 | 100.0 | 90.0 | 1.500 [1.500–1.500] "
        "| 0.900 [0.900–0.900] | 10/10, 10/10 |"
    )


def test_the_local_arm_keeps_the_adapter_in_process_without_a_trace(tmp_path: Path) -> None:
    import json

    from bsrctl.tempokv.spec import TempoKVSpec

    spec = TempoKVSpec.model_validate(yaml.safe_load(fig6.DEFAULT_SPEC.read_text()))
    local = fig6.arm_deployment(spec, fig6.LOCAL_ARM, tmp_path / "l").stack
    full = fig6.arm_deployment(spec, fig6.ADAPTER_ARM, tmp_path / "a").stack
    cfg = json.loads(local.extensions.tempokv.vllm_env()["BSRKV_TEMPOKV"])
    assert cfg["transport"] == "record" and cfg["trace_path"] is None
    cfg = json.loads(full.extensions.tempokv.vllm_env()["BSRKV_TEMPOKV"])
    assert cfg["transport"] == "connector" and cfg["trace_path"].endswith("adapter-trace.jsonl")
    assert cfg["adapter"] == json.loads(
        local.extensions.tempokv.vllm_env()["BSRKV_TEMPOKV"])["adapter"]  # fmt: skip
    assert fig6.arm_deployment(spec, "lmcache", tmp_path / "s").stack.extensions.tempokv is None


def test_every_arm_deploys_through_the_serving_runs_path(tmp_path: Path) -> None:
    from bsrctl.tempokv.experiments.serving import SETTINGS, deployment_for
    from bsrctl.tempokv.spec import TempoKVSpec

    spec = TempoKVSpec.model_validate(yaml.safe_load(fig6.DEFAULT_SPEC.read_text()))
    run = deployment_for(spec, tmp_path / "run")[0]
    for arm in (*fig6.ARMS, fig6.ADAPTER_ARM, fig6.LOCAL_ARM, fig6.RETAIN_ARM):
        dep = fig6.arm_deployment(spec, arm, tmp_path / arm)
        assert (type(dep).__name__, dep.kind, dep.settings) == (
            "LaunchedDeployment", "serving", SETTINGS), arm  # fmt: skip
        assert dep.stack.spec == run.stack.spec and dep.stack.dir == tmp_path / arm / "stack"
        ext, want = dep.stack.extensions, run.stack.extensions
        assert (ext.server_module, ext.l2_device) == (want.server_module, want.l2_device), arm
    # the adapter arms launch the run's TempoKV exactly (the trace under their own folder)
    adapter = fig6.arm_deployment(spec, fig6.ADAPTER_ARM, tmp_path / "a").stack.extensions
    assert adapter.tempokv == replace(
        run.stack.extensions.tempokv, trace_path=str(tmp_path / "a" / "adapter-trace.jsonl")
    )
    local = fig6.arm_deployment(spec, fig6.LOCAL_ARM, tmp_path / "l").stack.extensions.tempokv
    assert local == fig6.in_process(adapter.tempokv)
    # the retain arm: the stock arm's vLLM, LMCache with TempoKV's L1 options
    retain = fig6.arm_deployment(spec, fig6.RETAIN_ARM, tmp_path / "r").stack.extensions
    assert retain.tempokv is None
    assert retain.l1_options == run.stack.extensions.tempokv.l1_options
    assert retain.l1_options == L1Options("retain", 600)
    stock = fig6.arm_deployment(spec, "lmcache", tmp_path / "s").stack.extensions
    assert stock.l1_options == L1Options()  # LMCache's defaults


def test_claims_are_judged_on_the_paired_repeats() -> None:
    def cell(p95: float, tok: float) -> object:
        return fig6.Cell(p95, tok, 10, 10, "")

    cells = [
        {"lmcache": {8.0: cell(1.0, 100.0)}, "tempokv": {8.0: cell(0.8, 130.0)}},
        {"lmcache": {8.0: cell(1.1, 90.0)}, "tempokv": {8.0: cell(1.4, 120.0)}},
        {"lmcache": {8.0: cell(1.0, 100.0)}, "tempokv": {8.0: cell(0.9, 125.0)}},
        {"lmcache": {8.0: cell(1.2, 95.0)}, "tempokv": {8.0: cell(1.0, 120.0)}},
    ]
    tput, p95 = fig6.claims([8.0], cells)
    # every tput pair on one side, but 4 repeats cannot decide (sign test: p 0.125)
    assert tput.startswith("claim tput tempokv/lmcache @8: UNKNOWN, claim a/b >= 1: a/b median ")
    assert "over 4 paired repeats lies on the claimed side, but 4 paired repeats" in tput
    assert p95.startswith("claim p95 tempokv/lmcache @8: UNKNOWN, claim a/b <= 1: ")
    assert "straddles 1" in p95  # ratios .8 1.27 .9 .83: one repeat the other way
    more = cells + [
        {"lmcache": {8.0: cell(1.0, 100.0)}, "tempokv": {8.0: cell(0.9, 128.0)}},
        {"lmcache": {8.0: cell(1.1, 97.0)}, "tempokv": {8.0: cell(1.0, 121.0)}},
    ]
    tput, p95 = fig6.claims([8.0], more)  # six repeats decide
    assert tput.startswith("claim tput tempokv/lmcache @8: PASS, claim a/b >= 1: a/b median ")
    assert "over 6 paired repeats lies on the claimed side" in tput


def test_the_evidence_has_a_point_per_arm_and_rate_and_the_last_line_the_intervals() -> None:
    from bsrctl import stats

    def cell(p95: float, tok: float, same: int = 10) -> object:
        return fig6.Cell(p95, tok, same, 10, "")

    cells = [
        {"lmcache": {8.0: cell(1.0, 100.0)}, "tempokv": {8.0: cell(0.8, 130.0)}},
        {"lmcache": {8.0: cell(1.1, 90.0)}, "tempokv": {8.0: cell(1.4, 120.0, 9)}},
        {"lmcache": {8.0: cell(1.0, 100.0)}, "tempokv": {8.0: cell(0.9, 125.0)}},
    ]
    pts = {p.id: p.to_json() for p in fig6.bench_points([8.0], cells, fig6.ARMS)}
    assert list(pts) == ["fig6/lmcache@8", "fig6/tempokv@8"]
    assert pts["fig6/tempokv@8"]["samples"] == {"p95_ttft_s": [0.8, 1.4, 0.9],
                                                "tok_s": [130.0, 120.0, 125.0]}  # fmt: skip
    assert pts["fig6/tempokv@8"]["measures"]["canonical"] == 29
    assert [c["verdict"] for c in pts["fig6/tempokv@8"]["checks"]] == ["FAIL"]
    assert [c["verdict"] for c in pts["fig6/lmcache@8"]["checks"]] == ["PASS"]
    checks = fig6.claim_checks([8.0], cells)  # 3 repeats: a sampled claim stays UNKNOWN
    assert [(c.name, str(c.verdict)) for c in checks] == [
        ("tput_tempokv/lmcache_@8", "UNKNOWN"), ("p95_tempokv/lmcache_@8", "UNKNOWN")]  # fmt: skip
    tput = stats.paired_ratio_ci([130.0, 120.0, 125.0], [100.0, 90.0, 100.0], 0).text(3)
    p95 = stats.paired_ratio_ci([0.8, 1.4, 0.9], [1.0, 1.1, 1.0], 0).text(3)
    assert fig6.last_line([8.0], cells) == (
        f"fig6 tput tempokv/lmcache @8={tput} p95 tempokv/lmcache @8={p95}"
    )


def test_a_goodput_claim_joins_when_every_cell_measured_it() -> None:
    def cell(good: float) -> object:
        return fig6.Cell(1.0, 100.0, 10, 10, "", good)

    cells = [
        {"lmcache": {4.0: cell(0.5)}, "tempokv": {4.0: cell(0.9)}},
        {"lmcache": {4.0: cell(0.6)}, "tempokv": {4.0: cell(0.8)}},
        {"lmcache": {4.0: cell(0.4)}, "tempokv": {4.0: cell(0.7)}},
    ]
    got = fig6.claims([4.0], cells)
    assert [line.split(":")[0] for line in got] == [
        "claim tput tempokv/lmcache @4",
        "claim p95 tempokv/lmcache @4",
        "claim goodput tempokv/lmcache @4",
    ]
    no_slo = [{arm: {4.0: fig6.Cell(1.0, 100.0, 10, 10, "")} for arm in fig6.ARMS}]
    assert len(fig6.claims([4.0], no_slo)) == 2


def test_workload_flags_land_in_the_specs_serving_section() -> None:
    ns = fig6.argparse.Namespace(arrivals="poisson", burstiness=None, arrival_seed=3, turns=2,
                                 slo_ttft_s=0.5, kv_blocks=96)  # fmt: skip
    doc = {"serving": {"num_requests": 4, "arrivals": {"burstiness": 0.5},
                       "stack": {"vllm": {"max_model_len": 8704}}}, "seed": 1}  # fmt: skip
    assert fig6.workload_overrides(doc, ns) == {
        "seed": 1,
        "serving": {"num_requests": 4, "turns": 2, "slo_ttft_s": 0.5,
                    "arrivals": {"burstiness": 0.5, "process": "poisson", "seed": 3},
                    "stack": {"vllm": {"max_model_len": 8704,
                                       "num_gpu_blocks_override": 96}}},
    }  # fmt: skip
    none = fig6.argparse.Namespace(arrivals=None, burstiness=None, arrival_seed=None,
                                   turns=None, slo_ttft_s=None, kv_blocks=None)  # fmt: skip
    assert fig6.workload_overrides(doc, none) == doc


def test_a_bad_workload_flag_exits_2_naming_the_field(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["fig6", "--turns", "0"])
    assert fig6.main() == 2
    err = capsys.readouterr().err
    assert "serving.turns" in err and err.count("\n") == 1
    monkeypatch.setattr(sys, "argv", ["fig6", "--baseline", "dax", "--kv-blocks", "0"])
    assert fig6.main() == 2
    err = capsys.readouterr().err
    assert "serving.stack.vllm.num_gpu_blocks_override" in err and err.count("\n") == 1


def test_where_ttft_went_is_per_arm_over_the_streamed_requests(tmp_path: Path) -> None:
    import json

    from bsrctl.trace.timeline import spans_of

    for arm, pid in (("lmcache", 100), ("tempokv", 200)):
        (tmp_path / f"r0-{arm}" / "stack").mkdir(parents=True)
        state = {"launched": [{"name": "lmcache", "pid": pid, "children": [pid + 1]}]}
        (tmp_path / f"r0-{arm}" / "stack" / "state.json").write_text(json.dumps(state))
    pids = fig6.arm_pids(tmp_path)
    assert pids == {100: "lmcache", 101: "lmcache", 200: "tempokv", 201: "tempokv"}

    def rec(name: str, service: str, a: int, b: int, rid: str, pid: int) -> dict:
        ms = 1_000_000
        return {"name": name, "service": service, "start_ns": a * ms, "end_ns": b * ms,
                "attributes": {"request_id": rid}, "trace_id": rid, "span_id": name + rid,
                "parent_span_id": "", "pid": pid}  # fmt: skip

    recs = []
    for rid, pid, hold in (
        (f"bsrq-{1:016x}", 200, 30),
        (f"bsrq-{2:016x}", 201, 50),
        (f"bsrq-{3:016x}", 100, 0),
    ):
        recs += [rec("client.request", "bsrctl", 0, 100, rid, 1),
                 rec("client.ttft", "bsrctl", 0, 80, rid, 1),
                 rec("mp.lookup_prefetch", "lmcache", 10 + hold, 60, rid, pid)]  # fmt: skip
        if hold:
            recs.append(rec("tempokv.hold", "bsrkv.server", 10, 10 + hold, rid, pid))
    recs.append(rec("client.request", "bsrctl", 0, 500, f"bsrq-{4:016x}", 1))  # not streamed
    got = fig6.where_ttft_went(spans_of(recs), pids)
    assert got == {
        "lmcache": (1, 80.0, {"mp.lookup_prefetch": 50.0, "untraced": 30.0}),
        "tempokv": (2, 80.0, {"untraced": 30.0, "tempokv.hold": 40.0, "mp.lookup_prefetch": 10.0}),
    }
    assert fig6.ttft_lines(got)[1] == (
        "where TTFT went, tempokv: 2 requests, mean 80 ms: tempokv.hold 40, untraced 30, "
        "mp.lookup_prefetch 10 ms"
    )
