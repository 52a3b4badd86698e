"""Probe → confirmed plan → windows. Pure functions over hit bitmaps."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from bsrkv.restore.types import RestorePlan, RestoreRequest, RowId, Window


def complete_prefix(bitmaps: Sequence[Sequence[bool]], num_chunks: int) -> int:
    """Longest prefix of chunks where every row hits. No rows -> 0."""
    if not bitmaps:
        return 0
    for i in range(num_chunks):
        if not all(len(b) > i and b[i] for b in bitmaps):
            return i
    return num_chunks


def confirm_plan(
    request: RestoreRequest[Any],
    bitmaps: Sequence[Sequence[bool]],
    invalid_rows: Collection[RowId] = (),
    forced_local: bool = False,
) -> RestorePlan[Any]:
    """Compose per-row hit bitmaps into the complete advertised prefix.

    HMA/TP composition: the prefix is exposed only if every required (rank, group) row is
    valid. A row that is invalid (named in ``invalid_rows``, or whose bitmap is missing or
    of the wrong length) collapses the whole prefix to 0, as does a force-local marker.
    """
    n = request.num_chunks
    collapsed = [r for r in request.row_ids if r in set(invalid_rows)]
    if len(bitmaps) != len(request.rows):
        collapsed.extend(request.row_ids[len(bitmaps) :])
    for row, bm in zip(request.rows, bitmaps, strict=False):
        if len(bm) != n and row.row not in collapsed:
            collapsed.append(row.row)
    prefix = 0 if (collapsed or forced_local) else complete_prefix(bitmaps, n)
    return RestorePlan(
        request=request,
        prefix_chunks=prefix,
        collapsed_rows=tuple(sorted(set(collapsed))),
        forced_local=forced_local,
    )


def split_windows(prefix_chunks: int, window_chunks: int) -> tuple[Window, ...]:
    """Ordered windows G_1..G_K of at most W chunks covering [0, prefix). W = 0: one window."""
    if prefix_chunks <= 0:
        return ()
    w = prefix_chunks if window_chunks <= 0 else window_chunks
    return tuple(
        Window(index=j, chunk_start=s, chunk_stop=min(s + w, prefix_chunks))
        for j, s in enumerate(range(0, prefix_chunks, w))
    )
