"""Fault injectors of the failure matrix, each by real means on a real serving stack.

An injector has three steps around the request: ``arm()`` before it is sent (stop a process
by PID, remove / corrupt / truncate a tier's files, write fault-wrapper rules), ``strike()``
while it runs (between windows: wait until the fault wrapper holds window k, then stop a
process or flood L1 with other traffic) and ``recover()`` after it, which restarts what was
stopped and clears every rule so the next cell can reuse the deployment. Nothing ever tells
the code under test that a fault happened.

Isolation (``source``): the tier that serves the restore when nothing fails. ``mooncake``
hides the FS L2 (its folder is swapped for an empty one); ``fs`` makes Mooncake's lookups
miss through its fault wrapper (a lookup-phase drop looks like absence); ``all`` leaves both.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.experiments.failmatrix_spec import CellSpec
from bsrctl.lmcache_ext.faults.control import write_control_file
from bsrctl.stack.serving import ServingStack

Say = Callable[[str], None]


def chunk_hashes_hex(token_ids: list[int], chunk_size: int, num_chunks: int) -> list[str]:
    """LMCache's own chunk hashes of a prompt (the MP server's TokenHasher, blake3)."""
    from lmcache.v1.multiprocess.token_hasher import TokenHasher

    hasher = TokenHasher(chunk_size=chunk_size, hash_algorithm="blake3")
    return [h.hex() for h in hasher.compute_chunk_hashes(token_ids, end=num_chunks * chunk_size)]


def fs_objects(stack: ServingStack, chunk_hash: str) -> list[Path]:
    return sorted((stack.dir / "l2-fs").glob(f"*@{chunk_hash}*.data"))


def chunks_held(
    stack: ServingStack, ids: list[int], hashes: list[str], tier: str, ranks: int = 1
) -> int:
    """Chunks of the prompt `tier` holds: FS by its files (one per rank), Mooncake by a real
    lookup (``mooncake_holds``; it prefetches into L1, so forget L1 afterwards)."""
    if tier == "fs":
        return sum(1 for h in hashes if len(fs_objects(stack, h)) >= ranks)
    try:
        return mooncake_holds(stack, ids, timeout_s=10.0)
    except (StackFailed, OSError):
        return 0


def wait_tiers_hold(
    stack: ServingStack,
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


def mooncake_stored_keys(stack: ServingStack) -> int:
    """Keys Mooncake's adapter has stored since the server started (its own counter)."""
    return int(fault_stats(stack, "mooncake").get("inner", {}).get("stored", 0))


def wait_written_through(
    stack: ServingStack,
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
        if tier == "fs":
            return chunks_held(stack, ids, hashes, "fs")
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


def fault_stats(stack: ServingStack, tier: str) -> dict[str, Any]:
    """The fault wrapper's counters of one tier and its inner adapter's own counters."""
    for adapter in stack.lmcache_status()["storage_manager"].get("l2_adapters", []):
        fault = adapter.get("bsr_fault") or {}
        if fault.get("name") == tier:
            return {**fault, "inner": adapter.get("counters", {})}
    return {}


def prefetch(stack: ServingStack, token_ids: list[int]) -> str:
    """Submit LMCache's warm prefetch (L2 -> L1) of a prompt's chunks; returns its id."""
    body = {"model_name": str(stack.model_dir), "world_size": 1, "token_ids": token_ids}
    out = stack._http("POST", f"{stack.lmcache_http}/cache/prefetches", body)  # noqa: SLF001
    if not isinstance(out, dict) or "request_id" not in out:
        raise StackFailed(f"warm prefetch refused: {out!r}"[:300])
    return str(out["request_id"])


def prefetch_found(stack: ServingStack, request_id: str, timeout_s: float) -> int | None:
    """found_keys of a completed warm prefetch, or None if not completed within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = stack._http("GET", f"{stack.lmcache_http}/cache/prefetches/{request_id}")  # noqa: SLF001
        if isinstance(out, dict) and out.get("status") == "completed":
            return int(out.get("found_keys", 0))
        time.sleep(0.05)
    return None


def mooncake_holds(stack: ServingStack, token_ids: list[int], timeout_s: float = 15.0) -> int:
    """Chunks of the prompt Mooncake answers for, by a real lookup through LMCache: a warm
    prefetch with the FS tier's lookups dropped (so only Mooncake can answer), counted by
    Mooncake's fault-wrapper lookup counter. Leaves no rule armed (L1 is forgotten after)."""
    before = int(fault_stats(stack, "mooncake").get("lookup_hit_keys", 0))
    write_control_file(stack.fault_control("fs"), [{"action": "drop", "phase": "lookup"}])
    try:
        found = prefetch_found(stack, prefetch(stack, token_ids), timeout_s)
    finally:
        write_control_file(stack.fault_control("fs"), [])
    hits = int(fault_stats(stack, "mooncake").get("lookup_hit_keys", 0)) - before
    return 0 if found is None else min(found, hits)


def wait_held(stack: ServingStack, tier: str, before: int, timeout_s: float) -> float:
    """Seconds until tier's wrapper has delayed one more task (window k is being held)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if int(fault_stats(stack, tier).get("delayed_tasks", 0)) > before:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise StackFailed(f"window hold on tier {tier} not seen within {timeout_s:.0f} s")


@dataclass
class Injector:
    """One cell's fault. Subclasses override arm/strike/recover and fill `notes`."""

    stack: ServingStack
    cell: CellSpec
    token_ids: list[int]  # the cell's prompt
    say: Say
    notes: dict[str, Any] = field(default_factory=dict)  # what was done, for the evidence
    stopped_pids: list[int] = field(default_factory=list)  # processes this fault stopped
    _hidden: Path | None = None

    # -- isolation (always) --

    def isolate(self) -> None:
        st = self.stack
        if self.cell.source == "mooncake":
            fs_dir, hidden = st.dir / "l2-fs", st.dir / "l2-fs.hidden"
            fs_dir.rename(hidden)
            fs_dir.mkdir()
            self._hidden = hidden
        elif self.cell.source == "fs" and st.mooncake is not None:
            write_control_file(
                st.fault_control("mooncake"), [{"action": "drop", "phase": "lookup"}]
            )

    def unisolate(self) -> None:
        st = self.stack
        if self._hidden is not None:
            shutil.rmtree(st.dir / "l2-fs", ignore_errors=True)
            self._hidden.rename(st.dir / "l2-fs")
            self._hidden = None
        for tier in ("fs", "mooncake"):
            write_control_file(st.fault_control(tier), [])

    # -- the fault --

    def arm(self) -> None:
        pass

    def strike(self) -> None:
        pass

    def recover(self) -> None:
        pass

    # -- helpers --

    def hold_rule(self, delay_s: float) -> None:
        """Hold window k of the source tier for delay_s (the load's result is withheld)."""
        tier = self.cell.source
        self._held_before = int(fault_stats(self.stack, tier).get("delayed_tasks", 0))
        rule = {"action": "delay", "tasks": [self.cell.window], "delay_s": delay_s, "limit": 1}
        write_control_file(self.stack.fault_control(tier), [rule])
        self.notes["rule"] = {"tier": tier, **rule}

    def wait_hold(self) -> None:
        waited = wait_held(self.stack, self.cell.source, self._held_before, self.cell.bound_s)
        self.notes["hold_seen_after_s"] = round(waited, 3)

    def window_object(self) -> Path:
        """The FS object of window k's first chunk (file name carries the chunk hash)."""
        lm = self.stack.spec.lmcache
        chunk = self.cell.window * lm.window_chunks
        hashes = chunk_hashes_hex(self.token_ids, lm.chunk_size, chunk + 1)
        found = fs_objects(self.stack, hashes[chunk])
        if not found:
            raise StackFailed(f"no FS object for chunk {chunk} (hash {hashes[chunk][:16]})")
        return found[0]


class MasterDown(Injector):
    """Stop the Mooncake master by PID: before the request, or while window k is held."""

    def arm(self) -> None:
        if self.cell.at == "before_request":
            self._stop()
        else:
            self.hold_rule(self.cell.hold_s)

    def strike(self) -> None:
        if self.cell.at == "between_windows":
            self.wait_hold()
            self._stop()

    def _stop(self) -> None:
        moon = self.stack.mooncake
        pid = moon.master.pid
        moon.stop_master(timeout_s=5.0)
        self.stopped_pids.append(pid)
        self.notes["stopped"] = {"mooncake-master": pid, "at_s": round(time.monotonic(), 3)}

    def recover(self) -> None:
        moon = self.stack.mooncake
        moon.start_master()
        moon.start_node()
        self.stack._save_state()  # noqa: SLF001 - records the new PIDs for the audit
        self.notes["restarted"] = moon.pids()


class MooncakeAndFsAbsent(MasterDown):
    """Mooncake master stopped and every FS L2 object removed before the request."""

    def arm(self) -> None:
        self._stop()
        fs_dir = self.stack.dir / "l2-fs"
        removed = 0
        for path in fs_dir.iterdir():
            if path.is_file():
                path.unlink()
                removed += 1
        self.notes["fs_files_removed"] = removed


class WindowTimeout(Injector):
    """Window k's load is withheld beyond window_timeout_s (a delayed adapter)."""

    def arm(self) -> None:
        self.hold_rule(self.stack.spec.lmcache.window_timeout_s + 3.0)


class ObjectDamaged(Injector):
    """Window k's first FS object: bytes flipped (corrupted) or cut in half (truncated)."""

    def arm(self) -> None:
        path = self.window_object()
        data = bytearray(path.read_bytes())
        if self.cell.fault == "object_corrupted":
            mid = len(data) // 2
            for i in range(mid, min(mid + 4096, len(data))):
                data[i] ^= 0xFF
            how = f"4096 bytes flipped at offset {mid}"
        else:
            data = data[: len(data) // 2]
            how = f"truncated to {len(data)} bytes"
        path.write_bytes(bytes(data))
        self.notes["object"] = {"file": path.name, "how": how}


@dataclass
class L1Exhausted(Injector):
    """While window k is held, other traffic fills LMCache's L1: warm prefetches (L2 -> L1,
    LMCache's own API) of other prompts seeded beforehand. Requests through the same vLLM
    cannot do it: vLLM's worker waits on the held retrieve, so they are only scheduled after
    it. The L1 usage is sampled while window k is held and recorded as the fault's measure."""

    flood_prompts: list[list[int]] = field(default_factory=list)  # seeded by the rig

    def arm(self) -> None:
        self.hold_rule(self.cell.hold_s)

    def strike(self) -> None:
        self.wait_hold()
        st = self.stack
        t_hold = time.monotonic()
        ids = [prefetch(st, p) for p in self.flood_prompts]
        used_max, cap, samples = 0, 0, 0
        # sample until just before window k is released (hold_s after it was seen held)
        until = t_hold + max(0.5, self.cell.hold_s - 0.5)
        while time.monotonic() < until:
            try:
                used, cap = st.lmcache_status()["storage_manager"]["l1_usage"][:2]
                used_max, samples = max(used_max, int(used)), samples + 1
            except (OSError, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.05)
        found = [prefetch_found(st, i, 5.0) for i in ids]
        self.notes["flood"] = {
            "prefetched_prompts": len(ids),
            "prefetch_found_keys": found,
            "l1_used_max_bytes_while_held": used_max,
            "l1_capacity_bytes": int(cap),
            "l1_samples": samples,
        }


class LmcacheKilled(Injector):
    """While window k is held, the LMCache server is killed by PID (with its children)."""

    def arm(self) -> None:
        self.hold_rule(self.cell.hold_s)

    def strike(self) -> None:
        self.wait_hold()
        part = self.stack.parts["lmcache"]
        self.stopped_pids += [part.pid, *part.descendants()]
        part.stop(timeout_s=1.0)
        self.notes["killed"] = {"lmcache": self.stopped_pids, "at_s": round(time.monotonic(), 3)}

    def recover(self) -> None:
        # restart() also removes the dead server's /dev/shm segments and records the new PIDs
        self.stack.restart("lmcache")
        self.notes["restarted_lmcache"] = self.stack.parts["lmcache"].pid


INJECTORS: dict[str, type[Injector]] = {
    "mooncake_master_down": MasterDown,
    "mooncake_and_fs_absent": MooncakeAndFsAbsent,
    "window_timeout": WindowTimeout,
    "object_corrupted": ObjectDamaged,
    "object_truncated": ObjectDamaged,
    "l1_exhausted": L1Exhausted,
    "lmcache_killed": LmcacheKilled,
}


def run_bounded(fn: Callable[[], Any], timeout_s: float) -> tuple[Any, BaseException | None, bool]:
    """fn() in a daemon thread: (result, exception, finished within timeout_s)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # reported, never raised here
            box["error"] = exc

    th = threading.Thread(target=body, daemon=True)
    th.start()
    th.join(timeout_s)
    return box.get("result"), box.get("error"), not th.is_alive()
