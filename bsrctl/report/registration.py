"""The registration lines of a restore summary: what one chunk is, logically and as the
restore pool holds it, and the paper's own DeepSeek-V4-Flash figure where a run names it."""

from __future__ import annotations

from typing import Any

from bsrctl.registration.dsv4 import PAPER_BYTES_PER_CHUNK, PAPER_NUM_TENSORS


def chunk_line(doc: dict[str, Any]) -> str | None:
    """c beside c_allocated (each group's object rounded up to LMCache's L1 allocation unit,
    read from the allocator), from the first point that reports them."""
    for p in doc.get("points", []):
        m = p.get("measures") or {}
        alloc, unit = m.get("bytes_per_chunk_allocated"), m.get("l1_allocation_unit_bytes")
        if alloc is not None and unit is not None:
            c = m.get("bytes_per_chunk_expected")
            return (
                f"chunk in the restore pool: c_allocated = {alloc:,} B per rank at LMCache's "
                f"L1 allocation unit {unit:,} B (logical c = {c:,} B); the bound is "
                f"W·c_allocated + aux"
            )
    return None


def paper_line(reg: dict[str, Any]) -> str | None:
    """The paper's DeepSeek-V4-Flash registration, as the paper's figure, beside a run of
    that model: never read as the deployment's registration."""
    if "deepseek-v4" not in str(reg.get("model", "")).lower():
        return None
    return (
        f"paper's figure (DeepSeek-V4-Flash, MTP off, TP 2, 256-token chunks): "
        f"{PAPER_NUM_TENSORS} tensors, c = {PAPER_BYTES_PER_CHUNK:,} B per chunk per rank; "
        f"this run's registration: {reg.get('num_tensors', '?')} tensors, "
        f"c = {reg.get('bytes_per_chunk', '?')} B"
    )


def lines(doc: dict[str, Any]) -> list[str]:
    reg = (doc.get("stack") or {}).get("registration") or {}
    return [f"- {x}" for x in (chunk_line(doc), paper_line(reg)) if x]
