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
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.experiments.failmatrix.spec import CellSpec
from bsrctl.stack.launch.netns import wait_until
from bsrctl.stack.launch.serving import ServingStack
from bsrctl.stack.measure.tiers import (
    chunk_hashes_hex,
    fault_stats,
    fs_objects,
    prefetch,
    prefetch_found,
    wait_held,
)
from bsrkv.atomic import write_atomic

# The failure matrix's one import of the fault wrapper's control file.
from bsrkv.lmcache_ext.faults.control import write_control_file
from bsrkv.settings import RestoreSettings


def write_rules(stack: ServingStack, tier: str, rules: list[dict[str, Any]]) -> None:
    """Arm `rules` in `tier`'s fault wrapper (it re-reads its control file per task)."""
    write_control_file(stack.fault_control(tier), rules)


def clear_rules(stack: ServingStack) -> None:
    """No rule left armed in any tier's fault wrapper."""
    for tier in stack.fault_tiers() if _attached(stack) else ("fs", "mooncake"):
        write_control_file(stack.fault_control(tier), [])


@dataclass
class Injector:
    """One cell's fault. Subclasses override arm/strike/recover and fill `notes`."""

    stack: ServingStack
    cell: CellSpec
    token_ids: list[int]  # the cell's prompt
    settings: RestoreSettings  # the deployment's W and timeouts (the spec's restore: + W)
    notes: dict[str, Any] = field(default_factory=dict)  # what was done, for the evidence
    stopped_pids: list[int] = field(default_factory=list)  # processes this fault stopped
    deployment: Any = None  # the cell's Deployment (set by the rig: W over bsr.configure)
    _hidden: Path | None = None

    # -- isolation (always) --

    def isolate(self) -> None:
        st = self.stack
        if self.cell.source == "mooncake":
            fs_dir = _fs_dir(st)
            hidden = fs_dir.with_name(fs_dir.name + ".hidden")
            fs_dir.rename(hidden)
            fs_dir.mkdir()
            self._hidden = hidden
        elif self.cell.source == "fs" and "mooncake" in _wrapped(st):
            write_rules(st, "mooncake", [{"action": "drop", "phase": "lookup"}])

    def unisolate(self) -> None:
        st = self.stack
        if self._hidden is not None:
            shutil.rmtree(_fs_dir(st), ignore_errors=True)
            self._hidden.rename(_fs_dir(st))
            self._hidden = None
        clear_rules(st)

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
        write_rules(self.stack, tier, [rule])
        self.notes["rule"] = {"tier": tier, **rule}

    def wait_hold(self) -> None:
        waited = wait_held(self.stack, self.cell.source, self._held_before, self.cell.bound_s)
        self.notes["hold_seen_after_s"] = round(waited, 3)

    def window_object(self) -> Path:
        """The FS object of window k's first chunk (file name carries the chunk hash)."""
        chunk = self.cell.window * self.settings.window_chunks
        hashes = chunk_hashes_hex(self.token_ids, self.stack.spec.lmcache.chunk_size, chunk + 1)
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
        if _attached(self.stack):  # the operator's tooling stops its remote tier
            took = self.stack.run_command("stop_remote_tier")
            self.notes["stopped"] = {"operator_command": "stop_remote_tier", "s": took}
            return
        moon = self.stack.mooncake
        pid = moon.master.pid
        moon.stop_master(timeout_s=5.0)
        self.stopped_pids.append(pid)
        self.notes["stopped"] = {"mooncake-master": pid, "at_s": round(time.monotonic(), 3)}

    def recover(self) -> None:
        if _attached(self.stack):
            took = self.stack.run_command("start_remote_tier")
            self.notes["restarted"] = {"operator_command": "start_remote_tier", "s": took}
            return
        moon = self.stack.mooncake
        moon.start_master()
        moon.start_node()
        self.stack.save_state()  # records the new PIDs for the audit
        self.notes["restarted"] = moon.pids()


class MasterRestarted(MasterDown):
    """The Mooncake master restarts before the request: stopped by PID and started again
    with no metadata, the storage node left running (as when only the master's pod or
    process restarts). Whether the node mounts its segment on the new master again is
    waited on (bounded) and recorded, never forced; ``recover`` restarts the node only if
    it did not."""

    NODE_WAIT_S = 20.0

    def arm(self) -> None:
        if _attached(self.stack):  # the operator's tooling restarts its remote tier
            for name in ("stop_remote_tier", "start_remote_tier"):
                self.notes[name] = self.stack.run_command(name)
            return
        moon = self.stack.mooncake
        pid = moon.master.pid
        took = moon.start_master()  # stops the running master by PID, starts a new one
        self.stopped_pids.append(pid)
        t0 = time.monotonic()
        mounted = wait_until(moon.node_healthy, self.NODE_WAIT_S)
        self.notes["restarted"] = {
            "old_master": pid, "new_master": moon.master.pid, "master_healthy_after_s":
            round(took, 3), "node_pid": moon.node.pid, "node_mounted_again": mounted,
            "node_mounted_after_s": round(time.monotonic() - t0, 3) if mounted else None,
        }  # fmt: skip
        self.stack.save_state()

    def recover(self) -> None:
        if _attached(self.stack):
            return
        moon = self.stack.mooncake
        if not moon.node_healthy():
            moon.start_node()
            self.notes["node_restarted_at_recover"] = moon.node.pid
        self.stack.save_state()


class WholePlan(Injector):
    """W = 0 for the request (LMCache's own whole-plan retrieve, over bsr.configure): its
    prefix is larger than L1, so the whole plan cannot be held; ``recover`` sets W back."""

    def arm(self) -> None:
        self.deployment.configure(0, 0, self.settings.readback)
        self.notes["window_chunks"] = 0

    def recover(self) -> None:
        s = self.settings
        self.deployment.configure(s.window_chunks, s.admission_budget_chunks, s.readback)
        self.notes["window_chunks_after"] = self.settings.window_chunks


class MooncakeAndFsAbsent(MasterDown):
    """Mooncake master stopped and every FS L2 object removed before the request."""

    def arm(self) -> None:
        self._stop()
        fs_dir = _fs_dir(self.stack)
        removed = 0
        for path in fs_dir.iterdir():
            if path.is_file():
                path.unlink()
                removed += 1
        self.notes["fs_files_removed"] = removed


class WindowTimeout(Injector):
    """Window k's load is withheld beyond window_timeout_s (a delayed adapter)."""

    def arm(self) -> None:
        self.hold_rule(self.settings.window_timeout_s + 3.0)


class LoadFailsAlways(Injector):
    """Every load of the source tier fails while the rule is armed (each key reported
    missing): the request's restore, and any retry of it, can never succeed."""

    def arm(self) -> None:
        rule = {"action": "drop", "phase": "load"}
        write_rules(self.stack, self.cell.source, [rule])
        self.notes["rule"] = {"tier": self.cell.source, **rule}


SLOW_TASKS = 64  # slow_tier: load tasks held from window k on (more than a restore has)


class SlowTier(Injector):
    """The source tier turns slow mid-restore: every load task from window k on is held
    ``delay_s`` (default 1.5 x window_timeout_s), not only window k's."""

    def arm(self) -> None:
        delay = self.cell.delay_s or 1.5 * self.settings.window_timeout_s
        tasks = list(range(self.cell.window, self.cell.window + SLOW_TASKS))
        rule = {"action": "delay", "tasks": tasks, "delay_s": delay}
        write_rules(self.stack, self.cell.source, [rule])
        self.notes["rule"] = {"tier": self.cell.source, "action": "delay", "delay_s": delay,
                              "from_task": self.cell.window, "tasks": SLOW_TASKS}  # fmt: skip


class ObjectDamaged(Injector):
    """Window k's first FS object: bytes flipped (corrupted) or cut in half (truncated);
    ``recover`` puts its original bytes back (a soak repeats faults on the same prefixes)."""

    _original: tuple[Path, bytes] | None = None

    def arm(self) -> None:
        path = self.window_object()
        self._original = (path, path.read_bytes())
        data = bytearray(self._original[1])
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

    def recover(self) -> None:
        if self._original is not None:
            path, data = self._original
            write_atomic(path, data)  # a reader sees the damaged or the whole object
            self._original = None


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
        if _attached(self.stack):  # the operator's restart stops the server, then starts it
            took = self.stack.run_command("restart_lmcache")
            self.notes["killed"] = {"operator_command": "restart_lmcache", "s": took}
            return
        part = self.stack.parts["lmcache"]
        self.stopped_pids += [part.pid, *part.descendants()]
        part.stop(timeout_s=1.0)
        self.notes["killed"] = {"lmcache": self.stopped_pids, "at_s": round(time.monotonic(), 3)}

    def recover(self) -> None:
        if _attached(self.stack):
            self.stack.wait_healthy("lmcache", 60.0)
            return
        # restart() also removes the dead server's /dev/shm segments and records the new PIDs
        self.stack.restart("lmcache")
        self.notes["restarted_lmcache"] = self.stack.parts["lmcache"].pid


class StorageNodePartitioned(Injector):
    """While window k of the Mooncake tier is held, the veth link to the storage node goes
    down (both ends: the serving node loses its only route there); it comes up at recover."""

    def arm(self) -> None:
        if self.stack.hosts is None:
            raise StackFailed("storage_node_partitioned needs stack.mooncake.topology: two-hosts")
        self.hold_rule(self.cell.hold_s)

    def strike(self) -> None:
        self.wait_hold()
        assert self.stack.hosts is not None
        self.stack.hosts.link(up=False)
        self.notes["link_down"] = {"at_s": round(time.monotonic(), 3),
                                   "interface": self.stack.hosts.serving_if}  # fmt: skip

    def recover(self) -> None:
        assert self.stack.hosts is not None
        self.stack.hosts.link(up=True)
        moon = self.stack.mooncake
        t0 = time.monotonic()
        # the master and node answer across the link again before the next request
        ok = wait_until(lambda: moon.master_healthy() and moon.node_healthy(), 30.0)
        self.notes["link_up"] = {"healthy": ok, "after_s": round(time.monotonic() - t0, 3)}


class StorageNodeLost(Injector):
    """While window k of the Mooncake tier is held, the storage node is lost: its master
    and node stopped by PID, then its network namespace destroyed (the holder stopped; the
    veth pair goes with it). ``recover`` builds a new storage node (namespace, veth,
    Mooncake) so later cells have one again."""

    def arm(self) -> None:
        if self.stack.hosts is None:
            raise StackFailed("storage_node_lost needs stack.mooncake.topology: two-hosts")
        self.hold_rule(self.cell.hold_s)

    def strike(self) -> None:
        self.wait_hold()
        st = self.stack
        assert st.hosts is not None
        moon = st.mooncake
        parts = [moon.master.pid, moon.node.pid]
        moon.stop(timeout_s=5.0)
        holder = st.hosts.lose_storage()
        self.stopped_pids += [p for p in (*parts, holder) if p]
        self.notes["lost"] = {"mooncake": parts, "storage_netns_holder": holder,
                              "at_s": round(time.monotonic(), 3)}  # fmt: skip

    def recover(self) -> None:
        t0 = time.monotonic()
        self.stack.rebuild_storage_node()
        self.notes["rebuilt"] = {**self.stack.mooncake.pids(),
                                 "storage_netns_holder": self.stack.hosts.storage.pid,
                                 "after_s": round(time.monotonic() - t0, 3)}  # fmt: skip


def _attached(stack: Any) -> bool:
    return getattr(stack, "attached", False)


def _fs_dir(stack: Any) -> Path:
    """The FS tier's folder (an attached server reports where its own is)."""
    return stack.fs_l2_dir if _attached(stack) else stack.dir / "l2-fs"


def _wrapped(stack: Any) -> tuple[str, ...]:
    """The tiers this deployment has behind a fault wrapper."""
    if _attached(stack):
        return stack.fault_tiers()
    return ("fs", "mooncake") if stack.mooncake is not None else ("fs",)


# fault -> the operator commands it needs on an attached deployment (None: not possible there)
ATTACH_COMMANDS: dict[str, tuple[str, ...] | None] = {
    "mooncake_master_down": ("stop_remote_tier", "start_remote_tier"),
    "mooncake_and_fs_absent": ("stop_remote_tier", "start_remote_tier"),
    "lmcache_killed": ("restart_lmcache",),
    "storage_node_partitioned": None,  # the link of a topology bsrctl created
    "storage_node_lost": None,  # the namespace of a topology bsrctl created
    "mooncake_master_restarted": ("stop_remote_tier", "start_remote_tier"),
}


INJECTORS: dict[str, type[Injector]] = {
    "mooncake_master_down": MasterDown,
    "mooncake_and_fs_absent": MooncakeAndFsAbsent,
    "window_timeout": WindowTimeout,
    "object_corrupted": ObjectDamaged,
    "object_truncated": ObjectDamaged,
    "l1_exhausted": L1Exhausted,
    "lmcache_killed": LmcacheKilled,
    "storage_node_partitioned": StorageNodePartitioned,
    "load_fails_always": LoadFailsAlways,
    "slow_tier": SlowTier,
    "mooncake_master_restarted": MasterRestarted,
    "storage_node_lost": StorageNodeLost,
    "whole_plan_past_l1": WholePlan,
    "concurrent_restores": Injector,  # no fault: the load itself (failmatrix.concurrent)
}
