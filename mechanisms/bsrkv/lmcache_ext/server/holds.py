"""``bsr.holds``: how many whole chunks of a prompt each L2 adapter holds, by a real lookup.

The lookup is the one a restore's probe makes (``lmcache_ext.bsr.storage``): every adapter's
``submit_lookup_and_lock_task`` over the prompt's keys (every object group and TP rank, as
LMCache's own warm prefetch resolves them, ``cache_control/key_resolver.py``), then the
found keys unlocked. Nothing is loaded into L1 and any adapter answers, LMCache's stock
``fs`` as well as bsrkv's own: seeding checks work with whatever L2 the operator runs.
"""

from __future__ import annotations

import time
from typing import Any

from lmcache.v1.multiprocess.cache_control.key_resolver import resolve_grouped_object_keys

from bsrkv.lmcache_ext.bsr.protocol import HoldsReply

LOOKUP_TIMEOUT_S = 10.0


def l2_holds(ctx: Any, payload: dict[str, Any]) -> HoldsReply:
    """Payload ``{"model_name", "world_size", "token_ids", "cache_salt"?}``: per adapter (in
    the storage manager's order, that of ``/status``), the prompt's leading whole chunks
    whose every key (all groups, all ranks) it holds."""
    model, world = str(payload["model_name"]), int(payload.get("world_size", 1))
    registry = ctx.layout_desc_registry
    layouts = registry.find_group_layout_descs(model, world)
    if not layouts:
        return HoldsReply(0, (), f"no layout registered for {model!r} world_size={world}")
    key_groups, chunks = resolve_grouped_object_keys(
        ctx.token_hasher, model, world, list(payload["token_ids"]),
        str(payload.get("cache_salt", "")), layouts, registry.find_attn_desc(model, world),
    )  # fmt: skip
    rows = [list(g.keys) for g in key_groups]
    flat = [k for row in rows for k in row]
    held: list[int] = []
    for _desc, adapter in ctx.storage_manager.l2_adapters():
        task = adapter.submit_lookup_and_lock_task(flat, layouts)
        deadline = time.monotonic() + LOOKUP_TIMEOUT_S
        result = adapter.query_lookup_and_lock_result(task)
        while result is None and time.monotonic() < deadline:
            time.sleep(0.001)
            result = adapter.query_lookup_and_lock_result(task)
        found = set(result.get_indices_list()) if result is not None else set()
        if found:
            adapter.submit_unlock([flat[i] for i in sorted(found)])
        held.append(leading_whole(found, [len(r) for r in rows]))
    return HoldsReply(chunks, tuple(held), "")


def leading_whole(found: set[int], row_lengths: list[int]) -> int:
    """Leading chunks whose key is found in every row (``found``: row-major flat indices)."""
    starts = [sum(row_lengths[:i]) for i in range(len(row_lengths))]
    n = 0
    while row_lengths and all(
        n < ln and s + n in found for s, ln in zip(starts, row_lengths, strict=True)
    ):
        n += 1
    return n
