"""The restore-pool bound at LMCache's L1 allocation unit: W * c_allocated + aux, exact to
the byte on the storage stack (real StorageManager, real L1 allocator, real FS L2) for
registrations whose group objects are not multiples of the unit; the unit read from the
allocator at runtime."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bsrctl.experiments.restore import acceptance as acc
from bsrctl.registration import declared
from bsrctl.registration.l1 import allocation_unit
from bsrctl.registration.tiny import tiny_llama_cpu
from bsrkv.registration import GroupSpec, Registration, TensorSpec

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")

ROOT = Path(__file__).resolve().parents[3]
UNALIGNED = ROOT / "ladders" / "registrations" / "unaligned-two-group.yaml"
UNIT = 4096


def two_group(chunk: int = 256) -> Registration:
    """Group 0: (T, 100) bf16 = 51,200 B -> 53,248; group 1: (T, 3) f32 = 3,072 -> 4,096."""
    tensors = (
        TensorSpec("layers.0.kv", (chunk, 100), "bfloat16", 0),
        TensorSpec("layers.0.state", (chunk, 3), "float32", 1),
    )
    groups = (GroupSpec(0, "attention"), GroupSpec(1, "aux"))
    return Registration("two-group", tensors, groups, 1, chunk)


def test_allocated_bytes_round_each_group_up_to_the_unit() -> None:
    reg = two_group()
    assert (reg.group_bytes_per_chunk(0), reg.group_bytes_per_chunk(1)) == (51_200, 3_072)
    assert reg.allocated_group_bytes_per_chunk(0, UNIT) == 53_248
    assert reg.allocated_group_bytes_per_chunk(1, UNIT) == 4_096
    assert (reg.bytes_per_chunk, reg.allocated_bytes_per_chunk(UNIT)) == (54_272, 57_344)
    assert reg.allocated_bytes_per_chunk(1) == reg.bytes_per_chunk  # unit 1: logical c
    assert reg.rws_bound_bytes(4) == 4 * 54_272  # the logical bound, as before
    assert reg.rws_bound_bytes(4, UNIT) == 4 * 57_344
    aux = dataclasses.replace(reg, aux_bytes=100)
    assert aux.rws_bound_bytes(3, UNIT) == 3 * 57_344 + 100
    with pytest.raises(ValueError, match="allocation unit 0"):
        reg.allocated_bytes_per_chunk(0)


def test_declared_dsv4_rows_are_unaligned_and_the_tiny_llama_is_not() -> None:
    reg = declared.load(UNALIGNED)
    assert [reg.group_bytes_per_chunk(g) for g in (0, 1)] == [448_512, 67_584]
    assert [reg.allocated_group_bytes_per_chunk(g, UNIT) for g in (0, 1)] == [450_560, 69_632]
    assert (reg.bytes_per_chunk, reg.allocated_bytes_per_chunk(UNIT)) == (516_096, 520_192)
    tiny = tiny_llama_cpu()
    # 262,144 B is 64 units: the CPU figures are the same at the unit as logically
    assert tiny.allocated_bytes_per_chunk(UNIT) == tiny.bytes_per_chunk == 262_144
    assert tiny.rws_bound_bytes(4, UNIT) == tiny.rws_bound_bytes(4) == 1_048_576


def test_allocation_unit_is_what_the_storage_manager_reports() -> None:
    assert allocation_unit(SimpleNamespace(l1_memory_desc=SimpleNamespace(align_bytes=512))) == 512
    with pytest.raises(ValueError, match="allocation unit 0"):
        allocation_unit(SimpleNamespace(l1_memory_desc=SimpleNamespace(align_bytes=0)))


def test_bounded_restore_names_c_allocated_beside_c() -> None:
    ok = acc.bounded_restore(2, 2 * 520_192, 2 * 520_192, 10, 516_096, 520_192, UNIT)
    assert ok.verdict == acc.Verdict.PASS
    assert ok.detail == (
        "peak 1040384 B <= W*c_allocated + aux = 1040384 B (W = 2; c_allocated = 520192 B "
        "at the L1 unit 4096 B, c = 516096 B)"
    )
    over = acc.bounded_restore(2, 2 * 520_192 + 1, 2 * 520_192, 10, 516_096, 520_192, UNIT)
    assert over.verdict == acc.Verdict.FAIL
    assert over.detail.startswith("peak 1040385 B > W*c_allocated + aux = 1040384 B")
    # the logical bound a W*c_allocated peak used to be judged against: FAIL
    assert acc.bounded_restore(2, 2 * 520_192, 2 * 516_096).verdict == acc.Verdict.FAIL


SPEC = """\
stack:
  lmcache:
    l1_size_bytes: 8388608
    chunk_size: 256
registration: {reg}
storage:
  tp_ranks: 1
  root_dir: {root}
restore:
  window_timeout_s: 20
salt: t-unaligned
memory_reserve_bytes: 1 MiB
sweep:
  sizes_tokens: [1024, 2048, 4096]
  window_chunks: 2
  whole_plan_contrast: true
  repeats: 1  # one measurement per point, as before repeats (default 5)
"""

TWO_GROUP_INLINE = """
  model: two-group
  chunk_tokens: 256
  groups: [{index: 0, name: attention}, {index: 1, name: aux}]
  tensors:
    - {name: layers.0.kv, shape: [T, 100], dtype: bfloat16, group: 0}
    - {name: layers.0.state, shape: [T, 3], dtype: float32, group: 1}"""


def _sweep(tmp_path: Path, reg: str) -> dict[str, Any]:
    pytest.importorskip("lmcache")
    from bsrctl.evidence import Verdict, load_evidence
    from bsrctl.experiments.restore.sweep import run_sweep

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(reg=reg, root=tmp_path / "storage"))
    out = tmp_path / "out"
    assert run_sweep(spec, out, "storage", quiet=True) == Verdict.PASS
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return load_evidence(run / "evidence.json")


@pytest.mark.parametrize(
    ("reg", "c", "c_allocated"),
    [(str(UNALIGNED), 516_096, 520_192), (TWO_GROUP_INLINE, 54_272, 57_344)],
    ids=["dsv4-rows", "two-group"],
)
def test_storage_sweep_peak_is_w_c_allocated_to_the_byte(
    tmp_path: Path, reg: str, c: int, c_allocated: int
) -> None:
    doc = _sweep(tmp_path, reg)
    pts = {p["id"]: p for p in doc["points"]}
    assert list(pts) == [f"n{n}-w{w}" for n in (1024, 2048, 4096) for w in (2, 0)]
    for n in (1024, 2048, 4096):
        m = pts[f"n{n}-w2"]["measures"]
        assert (m["l1_allocation_unit_bytes"], m["bytes_per_chunk_expected"]) == (UNIT, c)
        assert m["bytes_per_chunk_allocated"] == c_allocated
        assert m["bytes_per_chunk_measured"] == c  # what was installed is the logical c
        # the measured L1 high-water is W chunks as the allocator holds them, flat in N
        assert m["restore_pool_peak_bytes"] == m["rws_bound_bytes"] == 2 * c_allocated
        checks = {k["name"]: k for k in pts[f"n{n}-w2"]["checks"]}
        assert checks["bounded_restore"]["verdict"] == "PASS"
        assert checks["bounded_restore"]["detail"] == (
            f"peak {2 * c_allocated} B <= W*c_allocated + aux = {2 * c_allocated} B (W = 2; "
            f"c_allocated = {c_allocated} B at the L1 unit {UNIT} B, c = {c} B)"
        )
        # the six acceptance checks and repeats_identical (accuracy + timed pass)
        assert [k["verdict"] for k in pts[f"n{n}-w2"]["checks"]] == ["PASS"] * 7
        whole = pts[f"n{n}-w0"]["measures"]
        assert whole["restore_pool_peak_bytes"] == (n // 256) * c_allocated
    md = (tmp_path / "out" / doc["run_id"] / "summary.md").read_text()
    assert (
        f"- chunk in the restore pool: c_allocated = {c_allocated:,} B per rank at LMCache's "
        f"L1 allocation unit {UNIT:,} B (logical c = {c:,} B); the bound is W·c_allocated + aux"
    ) in md
