"""What each tier of a serving deployment holds, read by real means: an attached
deployment's tiers by a real lookup through its server (``bsr.holds``), a launched one's FS by
its files, Mooncake by a real lookup through LMCache (or its adapter's counters), and the fault
wrapper's counters. Seeding and the failure matrix both wait on these."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.stack.launch.extensions import write_control_file
from bsrctl.stack.launch.serving import ServingClient


def chunk_hashes_hex(token_ids: list[int], chunk_size: int, num_chunks: int) -> list[str]:
    """LMCache's own chunk hashes of a prompt (the MP server's TokenHasher, blake3)."""
    from lmcache.v1.multiprocess.token_hasher import TokenHasher

    hasher = TokenHasher(chunk_size=chunk_size, hash_algorithm="blake3")
    return [h.hex() for h in hasher.compute_chunk_hashes(token_ids, end=num_chunks * chunk_size)]


def fs_objects(stack: ServingClient, chunk_hash: str) -> list[Path]:
    return sorted(stack.fs_l2_dir.glob(f"*@{chunk_hash}*.data"))


def chunks_held(
    stack: ServingClient, ids: list[int], hashes: list[str], tier: str, ranks: int = 1
) -> int:
    """Chunks of the prompt `tier` holds. On a deployment that answers ``held_chunks`` (the
    attached one: any L2 adapter, LMCache's stock ones too) by a real lookup of every
    adapter through the server (``bsr.holds``: lookup-and-lock, then unlock; nothing loaded);
    else FS by its files (one per rank), Mooncake by a real lookup (``mooncake_holds``; it
    prefetches into L1, so forget L1 afterwards)."""
    by_lookup = getattr(stack, "held_chunks", None)
    if by_lookup is not None:
        return int(by_lookup(ids, tier, ranks))
    if tier == "fs":
        return sum(1 for h in hashes if len(fs_objects(stack, h)) >= ranks)
    try:
        return mooncake_holds(stack, ids, timeout_s=10.0)
    except (StackFailed, OSError):
        return 0


def wait_tiers_hold(
    stack: ServingClient,
    ids: list[int],
    chunk_size: int,
    tiers: tuple[str, ...],
    wait_s: float,
    ranks: int = 1,
) -> dict[str, int]:
    """Chunks each tier holds once all of the prompt's whole chunks are there, or when
    wait_s has passed. LMCache's L2 write-through is asynchronous: a store that vLLM
    reported done may still be on its way to L1 (the store RPC is queued) or to L2, and an
    L1 cleared before the store controller read-locked an object drops it for good."""
    n = len(ids) // chunk_size
    hashes = chunk_hashes_hex(ids, chunk_size, n)
    return _poll_held(n, tiers, lambda t: chunks_held(stack, ids, hashes, t, ranks), wait_s)


def mooncake_stored_keys(stack: ServingClient) -> int:
    """Keys Mooncake's adapter has stored since the server started (its own counter)."""
    return int(fault_stats(stack, "mooncake").get("inner", {}).get("stored", 0))


def wait_written_through(
    stack: ServingClient,
    ids: list[int],
    chunk_size: int,
    tiers: tuple[str, ...],
    wait_s: float,
    mooncake_before: int = 0,
) -> dict[str, int]:
    """Like wait_tiers_hold, without touching any tier: FS by its files, Mooncake by the keys
    its adapter stored since `mooncake_before` (so L1 and the tiers' lookup and load
    counters stay as they were)."""
    n = len(ids) // chunk_size
    hashes = chunk_hashes_hex(ids, chunk_size, n)

    def held(tier: str) -> int:
        if tier == "fs":  # its files: a lookup would move the tiers' counters
            return sum(1 for h in hashes if fs_objects(stack, h))
        return min(n, mooncake_stored_keys(stack) - mooncake_before)

    return _poll_held(n, tiers, held, wait_s)


def _poll_held(
    n: int, tiers: tuple[str, ...], held_now: Callable[[str], int], wait_s: float
) -> dict[str, int]:
    """Poll each tier's count (it only grows) until every tier has n, or wait_s passed."""
    held = dict.fromkeys(tiers, 0)
    deadline = time.monotonic() + wait_s
    while True:
        for t in tiers:
            if held[t] < n:
                held[t] = held_now(t)
        if all(v == n for v in held.values()) or time.monotonic() >= deadline:
            return held
        time.sleep(0.2)


def fault_stats(stack: ServingClient, tier: str) -> dict[str, Any]:
    """The fault wrapper's counters of one tier and its inner adapter's own counters."""
    for adapter in stack.lmcache_status()["storage_manager"].get("l2_adapters", []):
        fault = adapter.get("bsr_fault") or {}
        if fault.get("name") == tier:
            return {**fault, "inner": adapter.get("counters", {})}
    return {}


def prefetch(stack: ServingClient, token_ids: list[int]) -> str:
    """Submit LMCache's warm prefetch (L2 -> L1) of a prompt's chunks; returns its id."""
    body = {"model_name": stack.model_name, "world_size": 1, "token_ids": token_ids}
    out = stack._http("POST", f"{stack.lmcache_http}/cache/prefetches", body)  # noqa: SLF001
    if not isinstance(out, dict) or "request_id" not in out:
        raise StackFailed(f"warm prefetch refused: {out!r}"[:300])
    return str(out["request_id"])


def prefetch_found(stack: ServingClient, request_id: str, timeout_s: float) -> int | None:
    """found_keys of a completed warm prefetch, or None if not completed within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = stack._http("GET", f"{stack.lmcache_http}/cache/prefetches/{request_id}")  # noqa: SLF001
        if isinstance(out, dict) and out.get("status") == "completed":
            return int(out.get("found_keys", 0))
        time.sleep(0.05)
    return None


HIDE_LOOKUPS = [{"action": "drop", "phase": "lookup"}]  # a dropped lookup reads as absence


@contextmanager
def lookups_hidden(stack: ServingClient, tiers: tuple[str, ...]) -> Iterator[None]:
    """Every lookup of `tiers` misses (through their fault wrappers) while the block runs;
    each tier's rules are put back as they were after it."""
    paths = [stack.fault_control(t) for t in tiers]  # attached: each asks the server
    saved = [_rules_in(p) for p in paths]
    try:
        for p in paths:
            write_control_file(p, HIDE_LOOKUPS)
        yield
    finally:
        for p, rules in zip(paths, saved, strict=True):
            write_control_file(p, rules)


def _rules_in(path: Path) -> list[dict[str, Any]]:
    """The rules a control file holds (none when it is absent; a bare list is rules too,
    as the fault adapter reads it)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    return list(doc["rules"] if isinstance(doc, dict) else doc)


def mooncake_holds(stack: ServingClient, token_ids: list[int], timeout_s: float = 15.0) -> int:
    """Chunks of the prompt Mooncake answers for, by a real lookup through LMCache: a warm
    prefetch with the FS tier's lookups dropped (so only Mooncake can answer), counted by
    Mooncake's fault-wrapper lookup counter. The FS tier's rules are as they were after it
    (L1 is forgotten after)."""
    before = int(fault_stats(stack, "mooncake").get("lookup_hit_keys", 0))
    with lookups_hidden(stack, ("fs",)):
        found = prefetch_found(stack, prefetch(stack, token_ids), timeout_s)
    hits = int(fault_stats(stack, "mooncake").get("lookup_hit_keys", 0)) - before
    return 0 if found is None else min(found, hits)


def wait_held(stack: ServingClient, tier: str, before: int, timeout_s: float) -> float:
    """Seconds until tier's wrapper has delayed one more task (window k is being held)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if int(fault_stats(stack, tier).get("delayed_tasks", 0)) > before:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise StackFailed(f"window hold on tier {tier} not seen within {timeout_s:.0f} s")
