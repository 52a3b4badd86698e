"""The shaping L2 wrapper: the FIFO device schedule to the byte and second (virtual time), the
wrapper pacing real loads by it (the schedule it recorded, not wall time), the config edges,
and the FS tier with O_DIRECT where the filesystem takes it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_fault_adapter_unit import FakeInner, keys, result

from bsrctl.stack.launch.extensions import (
    L2Device,
    LMCacheExtensions,
    ServerModule,
    odirect_allowed,
)
from bsrkv.lmcache_ext.adapters.shaping import DeviceShape, ShapingSchedule
from bsrkv.lmcache_ext.faults.adapter import BsrFaultL2Adapter, BsrFaultL2AdapterConfig

MIB = 1 << 20


def test_fifo_schedule_exact() -> None:
    sched = ShapingSchedule(DeviceShape(bandwidth_bytes_s=4 * MIB, latency_s=0.01))
    a = sched.admit(0.0, 2 * MIB)  # alone: 10 ms + 0.5 s
    b = sched.admit(0.1, 1 * MIB)  # queued behind a
    c = sched.admit(5.0, 0)  # device idle again; a zero-byte op still pays latency
    assert (a.start_s, a.done_s) == (0.0, 0.51)
    assert (b.start_s, b.done_s) == (0.51, 0.51 + 0.01 + 0.25)
    assert (c.start_s, c.done_s) == (5.0, 5.01)
    assert (sched.total_ops, sched.total_bytes) == (3, 3 * MIB)


@given(
    st.floats(1.0, 1e10),
    st.floats(0.0, 1.0),
    st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(0, 1 << 30)), max_size=30),
)
def test_schedule_invariants(bw: float, lat: float, ops: list[tuple[float, int]]) -> None:
    """Busy periods never overlap, no op starts before it is submitted, each takes exactly
    its service time, and the device is never idle while an op waits."""
    sched = ShapingSchedule(DeviceShape(bw, lat))
    t = 0.0
    prev_done = -math.inf
    for gap, size in ops:
        t += gap
        op = sched.admit(t, size)
        assert op.start_s == max(t, prev_done)
        assert op.done_s == op.start_s + (lat + size / bw)
        prev_done = op.done_s


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"latency_s": 0.1}, "shape.bandwidth_bytes_s"),
        ({"bandwidth_bytes_s": 0}, "shape.bandwidth_bytes_s"),
        ({"bandwidth_bytes_s": 1, "latency_s": -1}, "shape.latency_s"),
        ({"bandwidth_bytes_s": 1, "speed": 2}, "unknown fields ['speed']"),
        ([1, 2], "must be an object"),
    ],
)
def test_bad_shape_names_the_field(raw: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        DeviceShape.parse(raw)


class Obj:
    def __init__(self, size: int) -> None:
        self.size = size

    def get_size(self) -> int:
        return self.size


def test_wrapper_paces_loads_by_the_schedule() -> None:
    """Three loads of 1, 2 and 1 MiB submitted back to back at 8 MiB/s + 20 ms: the wrapper
    releases them in order, each no earlier than its shaped completion, and its recorded
    schedule is the FIFO one (lookups are metadata: not shaped)."""
    shape = {"bandwidth_bytes_s": 8 * MIB, "latency_s": 0.02}
    config = BsrFaultL2AdapterConfig.from_dict(
        {"type": "bsr_fault", "name": "shaped", "inner": {"type": "fs", "base_path": "."},
         "shape": shape}
    )  # fmt: skip
    adapter = BsrFaultL2Adapter(config, inner=FakeInner())  # type: ignore[arg-type]
    try:
        sizes = [1 * MIB, 2 * MIB, 1 * MIB]
        tasks = [
            adapter.submit_load_task(keys(2, f"L{i}"), [Obj(s // 2), Obj(s // 2)])
            for i, s in enumerate(sizes)
        ]
        lookup = adapter.submit_lookup_and_lock_task(keys(1, "q"), {})
        assert result(adapter, "lookup", lookup) == [0]
        assert [result(adapter, "load", t) for t in tasks] == [[0, 1]] * 3
        report = adapter.stats()["shaping"]
    finally:
        adapter.close()
    assert report["shape"] == shape
    assert (report["ops"], report["bytes"]) == (3, 4 * MIB)
    sched = report["schedule"]
    assert [op["size_bytes"] for op in sched] == sizes
    service = [0.02 + s / (8 * MIB) for s in sizes]  # 0.145, 0.27, 0.145 s
    for i, op in enumerate(sched):
        assert op["done_s"] - op["start_s"] == pytest.approx(service[i], abs=2e-6)
        if i:
            assert op["start_s"] == pytest.approx(max(op["submitted_s"], sched[i - 1]["done_s"]))


def test_unshaped_wrapper_reports_no_schedule() -> None:
    config = BsrFaultL2AdapterConfig.from_dict(
        {"type": "bsr_fault", "name": "plain", "inner": {"type": "fs", "base_path": "."}}
    )
    adapter = BsrFaultL2Adapter(config, inner=FakeInner())  # type: ignore[arg-type]
    try:
        assert adapter.stats()["shaping"] is None
    finally:
        adapter.close()


def test_fs_adapter_spec_carries_shape_and_odirect(tmp_path: Path) -> None:
    ext = LMCacheExtensions(
        ServerModule("m"), l2_device=L2Device(16 * MIB, 0.005, use_odirect=True)
    )
    spec = ext.fs_adapter(tmp_path / "l2", tmp_path / "faults-fs.json")
    params = spec["adapter_params"]
    assert params["shape"] == {"bandwidth_bytes_s": 16 * MIB, "latency_s": 0.005}
    assert params["inner"]["use_odirect"] is True
    plain = LMCacheExtensions(ServerModule("m")).fs_adapter(tmp_path / "l2", tmp_path / "c")
    assert "shape" not in plain["adapter_params"]
    assert "use_odirect" not in plain["adapter_params"]["inner"]


def test_odirect_allowed_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe opens a file with O_DIRECT and leaves nothing behind; a filesystem that
    refuses (EINVAL, as tmpfs before Linux 6.6) reads False, so the tier runs buffered."""
    import errno
    import os

    assert odirect_allowed(tmp_path / "l2") is True  # pytest's tmp is on a disk filesystem
    assert list((tmp_path / "l2").iterdir()) == []
    real_open = os.open

    def refuse(path: Any, flags: int, *a: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", refuse)
    assert odirect_allowed(tmp_path / "l2") is False
    assert list((tmp_path / "l2").iterdir()) == []
