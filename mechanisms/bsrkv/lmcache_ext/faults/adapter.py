"""Failure-injecting L2 adapter: wraps a real adapter and drops, delays or verifies its loads.

Faults happen by real means inside the L2 layer of a real LMCache process: a dropped key's
load reports failure (its bytes never become visible, exactly as an L2 read error), a delayed
task's result is withheld so the caller's own window timeout fires, and a verified load whose
bytes do not match the checksum taken at store time is reported as a miss. Nothing tells the
code under test that a fault happened.

Config: ``faults.config``; rules: ``faults.rules`` (arming rules, by control file or
``set_fault_rules``, resets the task and key ordinals); run-time control: ``faults.control``.
Importing this module registers the type ``bsr_fault`` (and the inner types ``bsr_fs``,
``bsr_mooncake``) and answers the server module's ``bsr.fault`` method in this process.

Loading it into the real ``lmcache server``::

    lmcache server ... --l2-adapter '{"type": "plugin",
        "module_path": "bsrkv.lmcache_ext.faults.adapter", "class_name": "BsrFaultL2Adapter",
        "adapter_params": {"name": "fs", "control_path": "/run/faults.json",
          "inner": {"type": "bsr_fs", "base_path": "/run/l2", "checksum": true}}}'
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from pathlib import Path
from typing import Any

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import (
    L2AdapterConfigBase,
    register_l2_adapter_type,
)
from lmcache.v1.distributed.l2_adapters.factory import (
    create_l2_adapter_from_registry,
    register_l2_adapter_factory,
)
from lmcache.v1.platform import create_event_notifier

from bsrkv.lmcache_ext.adapters.shaping import ShapingSchedule
from bsrkv.lmcache_ext.bsr.extensions import register_control
from bsrkv.lmcache_ext.faults.config import TYPE_NAME, BsrFaultL2AdapterConfig
from bsrkv.lmcache_ext.faults.control import (
    ControlFile,
    handle_control,
    register_live,
    unregister_live,
)
from bsrkv.lmcache_ext.faults.pump import FaultPump, Pending, PhaseState, Submitted, logger
from bsrkv.lmcache_ext.faults.rules import PHASES, FaultRule, decide, parse_rules
from bsrkv.lmcache_ext.faults.verify import Digests


class BsrFaultL2Adapter(FaultPump, L2AdapterInterface):
    """Decorator over an inner L2 adapter; lookups and loads pass through a pump thread."""

    def __init__(
        self,
        config: BsrFaultL2AdapterConfig,
        l1_memory_desc: Any = None,
        inner: L2AdapterInterface | None = None,
    ) -> None:
        super().__init__(max_capacity_bytes=0)
        self._closed = False
        self._inner = inner or create_l2_adapter_from_registry(config.inner_config, l1_memory_desc)
        self._name = config.name
        self._control = (
            ControlFile(Path(config.control_path), logger) if config.control_path else None
        )
        self._verify = config.verify
        self._digests = Digests(
            Path(config.checksum_dir) if config.checksum_dir else None, config.checksum
        )
        # loads paced by a device of the spec's speed (the page cache would make them free)
        self._shaping = ShapingSchedule(config.shape) if config.shape is not None else None
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = parse_rules(config.rules)
        self._phases = {p: PhaseState() for p in PHASES}
        self._submitted: list[Submitted] = []  # FIFO, drained by the pump under self._lock
        self._heap: list[tuple[float, int, str, L2TaskId]] = []  # (release_at, seq, phase, id)
        self._seq = itertools.count()
        self._stats = {
            "dropped_keys": 0,
            "delayed_tasks": 0,
            "verify_mismatch": 0,
            "verify_missing": 0,
            "rules_armed": 0,
            "lookup_keys": 0,
            "lookup_hit_keys": 0,
            "load_keys": 0,
            "load_hit_keys": 0,
            "inner_errors": 0,
        }
        self._events: list[dict] = []  # recent faults, for tests and reports
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._wake_efd = create_event_notifier()
        self._stop = threading.Event()
        with self._lock:
            self._refresh_control()
        self._pump_thread = threading.Thread(
            target=self._pump, name=f"bsr-fault-{self._name}", daemon=True
        )
        self._pump_thread.start()
        if not register_live(self._name, self):
            logger.warning(
                "fault adapter name %r was already live in this process: run-time control "
                "now reaches the newest one; give each adapter its own name",
                self._name,
            )
        logger.warning(
            "BsrFaultL2Adapter %r ACTIVE over %s (control_path=%s, verify=%s, %d rules)",
            self._name,
            type(self._inner).__name__,
            self._control.path if self._control else None,
            self._verify,
            len(self._rules),
        )

    @property
    def inner(self) -> L2AdapterInterface:
        return self._inner

    # ---- control -------------------------------------------------------

    def set_rules(self, rules: list[dict]) -> None:
        parsed = parse_rules(rules)
        with self._lock:
            self._decide_submitted()  # tasks submitted before this call keep the old rules
            self._arm(parsed)

    def _arm(self, rules: list[FaultRule]) -> None:  # holds self._lock
        self._rules = rules
        for state in self._phases.values():
            state.task_ordinal = 0
            state.key_ordinal = 0
        self._stats["rules_armed"] += 1
        logger.warning("BsrFaultL2Adapter %r armed %d rules", self._name, len(rules))

    def _refresh_control(self) -> None:  # holds self._lock
        """Re-arm if the control file changed. Check and reload under one lock hold, so two
        callers cannot both see the change and arm twice (resetting the ordinals twice)."""
        rules = self._control.changed_rules() if self._control is not None else None
        if rules is not None:
            self._arm(rules)

    def stats(self) -> dict:
        with self._lock:
            out: dict[str, Any] = dict(self._stats)
            out["rules"] = len(self._rules)
            out["events"] = list(self._events)
            out["shaping"] = self.shaping_report()
        return out

    def shaping_report(self) -> dict | None:  # holds self._lock
        """The shaped device and its schedule so far (monotonic seconds), None if unshaped."""
        shaping = self._shaping
        if shaping is None:
            return None
        return {
            "shape": shaping.shape.to_json(),
            "ops": shaping.total_ops,
            "bytes": shaping.total_bytes,
            "schedule": [op.to_json() for op in shaping.ops],
        }

    # ---- event fds -----------------------------------------------------

    def get_store_event_fd(self) -> int:
        return self._inner.get_store_event_fd()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    # ---- store ---------------------------------------------------------

    def submit_store_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        if self._verify:
            # Hash now: the buffers are only guaranteed until the inner store completes.
            for key, obj in zip(keys, objects, strict=True):
                buf = obj.byte_array
                self._digests.put(key, self._digests.checksum.line(buf))
        return self._inner.submit_store_task(keys, objects)

    def pop_completed_store_tasks(self) -> dict:
        return self._inner.pop_completed_store_tasks()

    # ---- lookup and load -----------------------------------------------

    def submit_lookup_and_lock_task(self, keys: list[ObjectKey], group_layout_descs: dict) -> int:
        task_id = self._inner.submit_lookup_and_lock_task(keys, group_layout_descs)
        self._track("lookup", task_id, keys, None)
        return task_id

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Any:
        with self._lock:
            return self._phases["lookup"].done.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        self._inner.submit_unlock(keys)

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> L2TaskId:
        task_id = self._inner.submit_load_task(keys, objects)
        self._track("load", task_id, keys, objects)
        return task_id

    def query_load_result(self, task_id: L2TaskId) -> Any:
        with self._lock:
            return self._phases["load"].done.pop(task_id, None)

    def _track(
        self, phase: str, task_id: L2TaskId, keys: list[ObjectKey], objects: list[Any] | None
    ) -> None:
        """Queue the task; the pump decides its faults (no file I/O on the caller's thread)."""
        with self._lock:
            self._submitted.append(Submitted(phase, task_id, keys, objects, time.monotonic()))
        self._wake_efd.notify()

    def _decide_submitted(self) -> None:  # holds self._lock
        """Decide the queued tasks' faults in submission order. One control-file check
        covers the whole batch (not one stat per task), and it runs after every queued
        task was submitted, so a file written before a submission still applies to it."""
        if not self._submitted:
            return
        self._refresh_control()
        batch, self._submitted = self._submitted, []
        for sub in batch:
            self._decide(sub)

    def _decide(self, sub: Submitted) -> None:  # holds self._lock
        phase, keys = sub.phase, sub.keys
        state = self._phases[phase]
        task_ordinal = state.task_ordinal
        state.task_ordinal += 1
        faults = decide(self._rules, phase, keys, task_ordinal, state.key_ordinal)
        state.key_ordinal += len(keys)
        self._rules = faults.rules
        drops, delay_s = set(faults.drops), faults.delay_s
        for i in sorted(drops):
            self._stats["dropped_keys"] += 1
            self._record(
                {
                    "fault": "drop",
                    "phase": phase,
                    "task": task_ordinal,
                    "position": i,
                    "chunk_hash": keys[i].chunk_hash.hex(),
                    "kv_rank": keys[i].kv_rank,
                }
            )
        if delay_s > 0:
            self._stats["delayed_tasks"] += 1
            self._record(
                {"fault": "delay", "phase": phase, "task": task_ordinal, "delay_s": delay_s}
            )
        release_at = sub.at + delay_s
        if phase == "load" and self._shaping is not None:
            size = sum(_object_bytes(o) for o in sub.objects or ())
            release_at = max(release_at, self._shaping.admit(sub.at, size).done_s)
        state.pending[sub.task_id] = Pending(keys, sub.objects, drops, release_at)
        heapq.heappush(self._heap, (release_at, next(self._seq), phase, sub.task_id))

    # ---- pass-through --------------------------------------------------

    def register_listener(self, listener: Any) -> None:
        self._inner.register_listener(listener)

    def set_backend_identity(self, name: str, shared: bool = False) -> None:
        super().set_backend_identity(name, shared)
        self._inner.set_backend_identity(name, shared)

    def delete(self, keys: list[ObjectKey]) -> None:
        self._inner.delete(keys)

    def get_usage(self):
        return self._inner.get_usage()

    @property
    def supports_global_eviction(self) -> bool:
        return self._inner.supports_global_eviction

    def list_l2_keys(self, model_name=None, page_size=500, cursor=None):
        return self._inner.list_l2_keys(model_name, page_size, cursor)

    def report_status(self) -> dict:
        status = self._inner.report_status()
        status["bsr_fault"] = {
            "name": self._name,
            # where its rules are armed: attach mode writes here (same host) to inject
            "control_path": str(self._control.path) if self._control else None,
            "pump_alive": self._pump_thread.is_alive(),
            **{k: v for k, v in self.stats().items() if k not in ("events", "shaping")},
        }
        status["is_healthy"] = bool(status.get("is_healthy", True)) and (
            self._pump_thread.is_alive()
        )
        return status

    def close(self) -> None:
        """Stop the pump and close the inner adapter; a second call does nothing (as for
        LMCache's own adapters: the event fds are closed once)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake_efd.notify()
        self._pump_thread.join(timeout=5)
        unregister_live(self._name, self)
        self._inner.close()
        for efd in (self._lookup_efd, self._load_efd, self._wake_efd):
            efd.close()


def _object_bytes(obj: Any) -> int:
    """Bytes an L1 memory object holds (LMCache's MemoryObj: ``get_size``)."""
    get_size = getattr(obj, "get_size", None)
    return int(get_size()) if get_size is not None else len(obj.byte_array)


# ---- registration -----------------------------------------------------------------------


def _create(config: L2AdapterConfigBase, l1_memory_desc: Any = None) -> L2AdapterInterface:
    assert isinstance(config, BsrFaultL2AdapterConfig)
    return BsrFaultL2Adapter(config, l1_memory_desc)


def _register() -> None:
    try:
        register_l2_adapter_type(TYPE_NAME, BsrFaultL2AdapterConfig)
        register_l2_adapter_factory(TYPE_NAME, _create)
    except ValueError:
        pass
    register_control("bsr.fault", handle_control)


_register()

__all__ = ["BsrFaultL2Adapter", "BsrFaultL2AdapterConfig"]
