"""Figure 6 across the flash's two read paths (``bench/tempokv/fig6/device.py``,
``fig6/predict.py``, ``stack/launch/flash_probe.py``): the spec's ratio and caps, fio's
figures read exactly, the device lines, each arm's flash time per MiB, the prediction beside
the live intervals and the decomposition, on fixed inputs; the prediction in virtual time,
exact."""

from __future__ import annotations

import math

import yaml
from fig6 import dax, device
from fig6.cells import Cell
from fig6.headroom import Headroom
from fig6.predict import Prediction, inside, predict

from bsrctl.stack.launch.flash_probe import FlashFigures, fio_argv, read_figures
from bsrctl.tempokv.flash_spec import demand_iops
from bsrctl.tempokv.spec import TempoKVSpec

MIB = 1 << 20
ARMS = ("lmcache-dax", "tempokv")


def _spec() -> TempoKVSpec:
    return TempoKVSpec.model_validate(yaml.safe_load(dax.SPEC.read_text()))


def test_the_spec_s_ratio_and_the_caps_it_sets() -> None:
    spec = _spec()
    assert device.default_ratios(spec) == [1.0, 0.4236]
    assert (device.iops_for(spec, 1.0), device.iops_for(spec, 0.4236)) == (2816, 1193)
    assert demand_iops(0.1) == 1  # never no cap by rounding


def _fio(bw: float, iops: float) -> dict:
    return {"jobs": [{"read": {"bw_bytes": bw, "iops": iops}}]}


def test_fio_figures_and_argv() -> None:
    got = read_figures({"demand_qd1": _fio(4872357.0, 1189.5), "demand_qd4": _fio(4876450.0,
                        1190.5), "staging": _fio(11503659.0, 10.97)})  # fmt: skip
    assert got == FlashFigures(4872357.0, 4876450.0, 11503659.0, 1189.5, 1190.5)
    assert round(got.ratio, 4) == 0.4235
    assert fio_argv("demand_qd4", "/dev/loop3", 128 * MIB) == [
        "fio", "--output-format=json", "--name=demand_qd4", "--filename=/dev/loop3",
        "--direct=1", "--readonly", f"--size={128 * MIB}", "--time_based", "--runtime=3.0",
        "--ramp_time=0.5", "--rw=randread", "--bs=4k", "--ioengine=libaio", "--iodepth=4",
    ]  # fmt: skip


def test_device_lines_compare_the_measured_ratio_with_the_spec_s() -> None:
    spec = _spec()
    near = FlashFigures(4.8 * MIB, 4.8 * MIB, 11 * MIB, 1229.0, 1229.0)
    far = FlashFigures(2.0 * MIB, 2.0 * MIB, 11 * MIB, 512.0, 512.0)
    got = device.device_lines(spec, {0.4236: (near, {}), 1.0: (far, {})})
    assert got[1] == (
        "device ratio=0.4236 (cap 1193 IOPS): demand 4 KiB qd1 4.80 MiB/s (1229 IOPS), qd4 "
        "4.80 MiB/s (1229 IOPS); staging 1 MiB 11.00 MiB/s; measured ratio 0.4364 vs the "
        "spec's 0.4236 (+3.0 %, within ±20 %)"
    )
    assert got[2].endswith("measured ratio 0.1818 vs the spec's 1.0000 (-81.8 %, OUTSIDE ±20 %)")
    assert device.summary(spec, {1.0: (far, {"x": 1})})["1"]["demand_iops_cap"] == 2816


def _cell(p95: float, tok_s: float, read: int = 0, reads: int = 0) -> Cell:
    tier = {"flash_read_bytes": read, "flash_reads": reads}
    return Cell(p95, tok_s, 16, 16, "", tier=tier)


def _cells(tk: list[tuple[float, float]], lm: list[tuple[float, float]], rate: float = 4.0):
    return [{"lmcache-dax": {rate: _cell(p, t, 8 * MIB, 2048)},
             "tempokv": {rate: _cell(q, u, 8 * MIB, 8)}}
            for (q, u), (p, t) in zip(tk, lm, strict=True)]  # fmt: skip


def test_flash_time_per_mib_per_arm() -> None:
    cells = _cells([(1.0, 10.0)] * 2, [(1.0, 10.0)] * 2)
    room = {"lmcache-dax": {4.0: [Headroom(5.0, 3.2, 0.0, 0.1)] * 2},
            "tempokv": {4.0: [Headroom(5.0, 1.4, 0.2, 0.1)] * 2}}  # fmt: skip
    assert device.flash_cost_lines([4.0], cells, ARMS, room) == [
        "flash time lmcache-dax @4 rps: 0.400 s/MiB (6.40 s reading, 16.0 MiB in 4096 reads "
        "of 4.0 KiB mean, over 2 repeats)",
        "flash time tempokv @4 rps: 0.175 s/MiB (2.80 s reading, 16.0 MiB in 16 reads of "
        "1024.0 KiB mean, over 2 repeats)",
    ]


def test_prediction_against_the_live_interval() -> None:
    cells = _cells([(0.5, 12.0), (0.6, 12.5), (0.55, 11.5)], [(1.0, 10.0)] * 3)
    pred = [Prediction(4.0, 0.57, 1.5, 0.0, 0)]
    lines, hits, n = device.prediction_vs_live(pred, cells, "tempokv", "lmcache-dax")
    assert (hits, n) == (1, 2)
    assert lines == ["prediction @4 rps: p95 0.57 vs live 0.55 [0.5, 0.6] (inside), tput 1.5 "
                     "vs live 1.2 [1.15, 1.25] (outside)"]  # fmt: skip
    assert inside(pred[0], {"p95": (0.5, 0.6), "tput": (1.5, 1.5)}) == {"p95": True, "tput": True}


def test_the_gain_splits_into_headroom_and_asymmetry() -> None:
    by_ratio = {1.0: _cells([(0.9, 11.0)] * 3, [(1.0, 10.0)] * 3),
                0.4: _cells([(0.45, 15.0)] * 3, [(1.0, 10.0)] * 3)}  # fmt: skip
    (line,) = device.decomposition_lines([4.0], by_ratio, "tempokv", "lmcache-dax")
    share = math.log(0.9) / math.log(0.45)
    assert line == (
        "decomposition ratio=0.4 @4 rps: p95 0.45 = headroom (ratio 1) 0.9 x asymmetry 0.5 "
        f"(headroom's share of the log gain {share:.0%}); tput 1.5 = headroom (ratio 1) 1.1 x "
        f"asymmetry 1.36 (headroom's share of the log gain {math.log(1.1) / math.log(1.5):.0%})"
    )
    assert device.decomposition_lines([4.0], {0.4: by_ratio[0.4]}, "tempokv", "lmcache-dax") == [
        "decomposition: needs ratio 1 among --demand-ratio (the timing-only gain)"
    ]


def test_the_prediction_in_virtual_time() -> None:
    """The spec's device at the paper's scale, queued loads, 2 seeds: at ratio 1 the two
    coincide (the queued regime leaves no flash idle); at the published ratio LMCache-DAX's
    reads take 1/0.4236 as long and TempoKV's staging gains."""
    spec = _spec()
    same = predict(spec, [0.5, 4.0], 11 * MIB, 11 * MIB, seeds=2)
    assert [(p.rate, round(p.p95, 3), round(p.tput, 3)) for p in same] == [
        (0.5, 1.0, 1.0), (4.0, 1.0, 1.0)]  # fmt: skip
    got = predict(spec, [0.5, 4.0], 11 * MIB, 4.66 * MIB, seeds=2)
    assert [(p.rate, round(p.p95, 3), round(p.tput, 3), p.tempokv_ordinary) for p in got] == (
        PREDICTED
    )


PREDICTED = [(0.5, 0.56, 1.024, 0), (4.0, 0.237, 2.287, 0)]
