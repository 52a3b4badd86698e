"""Failure-injecting L2 adapter: wraps a real adapter and drops, delays or verifies its loads.

Faults happen by real means inside the L2 layer of a real LMCache process: a dropped key's
load reports failure (its bytes never become visible, exactly as an L2 read error), a delayed
task's result is withheld so the caller's own window timeout fires, and a verified load whose
bytes do not match the sha256 taken at store time is reported as a miss. Nothing tells the
code under test that a fault happened.

Config (JSON; type ``"bsr_fault"`` in-process, or through the stock ``plugin`` type)::

    {"inner": {...adapter spec with "type"...},   # required: bsr_fs, bsr_mooncake, fs, plugin..
     "name": "default",          # handle for run-time control (set_fault_rules(..., name))
     "control_path": "/run/faults.json",   # optional JSON file {"rules": [...]}, re-read
                                 # whenever its mtime or size changes; absent file = no rules;
                                 # a change seen before a task's submission applies to it
     "rules": [...],             # initial rules
     "verify": false,            # sha256 at store, checked at load (any inner adapter)
     "checksum_dir": null}       # where verify keeps digests (else in memory, lost at exit)

A rule (all selectors present must match; a missing selector matches everything)::

    {"action": "drop" | "delay",
     "phase": "load" | "lookup",           # default "load"; lookup drops look like absence
     "delay_s": 5.0,                       # delay: result held until submit + delay_s
     "chunk_hashes": ["00ab.."],           # hex ObjectKey.chunk_hash
     "ranks": [1],                         # global rank, (kv_rank >> 16) & 0xff
     "kv_ranks": [16842754],               # raw ObjectKey.kv_rank
     "object_groups": [0], "models": ["m"],
     "positions": [0, 3],                  # index inside one task's key batch
     "tasks": [2],                         # ordinal of the phase's tasks since the rules
                                           # were armed: with BSR, window k = load task k
     "key_ordinals": [17],                 # ordinal of the phase's keys since armed
     "limit": 1}                           # at most this many keys (drop) / tasks (delay)

Arming rules (file change, ``set_fault_rules``) resets the task and key ordinals.

Run-time control from a test or a server module: ``set_fault_rules``, ``clear_fault_rules``,
``fault_stats`` (plain functions over this process's live adapters) and ``handle_control``
(bytes in, bytes out: ``{"op": "set"|"clear"|"stats", "name": .., "rules": [..]}``), ready to
be registered as a ``server_module_handler``. Across processes use ``control_path`` and
``write_control_file``.

Loading it into the real ``lmcache server``::

    lmcache server ... --l2-adapter '{"type": "plugin",
        "module_path": "bsrctl.lmcache_ext.fault_adapter", "class_name": "BsrFaultL2Adapter",
        "adapter_params": {"name": "fs", "control_path": "/run/faults.json",
          "inner": {"type": "bsr_fs", "base_path": "/run/l2", "checksum": true}}}'

(the inner types ``bsr_fs`` and ``bsr_mooncake`` are registered when this module is imported).
"""

from __future__ import annotations

import heapq
import itertools
import json
import select
import threading
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.logging import init_logger
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import (
    L2AdapterConfigBase,
    get_l2_adapter_config_class,
    register_l2_adapter_type,
)
from lmcache.v1.distributed.l2_adapters.factory import (
    create_l2_adapter_from_registry,
    register_l2_adapter_factory,
)
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename
from lmcache.v1.platform import create_event_notifier
from lmcache.v1.platform.event_notifier import consume_fd

from bsrctl.lmcache_ext import fs_adapter as _fs_adapter  # noqa: F401  registers bsr_fs
from bsrctl.lmcache_ext import mooncake_adapter as _mooncake_adapter  # noqa: F401
from bsrctl.lmcache_ext.fs_adapter import (
    format_checksum,
    parse_checksum,
    sha256_hex,
    write_atomic,
)

logger = init_logger(__name__)

TYPE_NAME = "bsr_fault"
PHASES = ("load", "lookup")
ACTIONS = ("drop", "delay")
_LIST_SELECTORS = {
    "chunk_hashes": str,
    "ranks": int,
    "kv_ranks": int,
    "object_groups": int,
    "models": str,
    "positions": int,
    "tasks": int,
    "key_ordinals": int,
}
_RULE_FIELDS = {"action", "phase", "delay_s", "limit", *_LIST_SELECTORS}
_MAX_RECORDED_EVENTS = 4096


# ---------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FaultRule:
    action: str  # "drop" | "delay"
    phase: str  # "load" | "lookup"
    delay_s: float  # delay: seconds after submission before the result is reported
    selectors: dict[str, frozenset]  # selector name -> accepted values; absent = any
    limit: int | None  # keys (drop) or tasks (delay) still affected; spent by replace()

    @classmethod
    def parse(cls, raw: Any, where: str = "rule") -> FaultRule:
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: must be a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - _RULE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown}; known: {sorted(_RULE_FIELDS)}")
        action = raw.get("action")
        if action not in ACTIONS:
            raise ValueError(f"{where}.action: {action!r}, expected one of {list(ACTIONS)}")
        phase = raw.get("phase", "load")
        if phase not in PHASES:
            raise ValueError(f"{where}.phase: {phase!r}, expected one of {list(PHASES)}")
        delay_s = raw.get("delay_s", 0.0)
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or delay_s < 0:
            raise ValueError(f"{where}.delay_s: must be a number >= 0, got {delay_s!r}")
        if action == "delay" and delay_s <= 0:
            raise ValueError(f"{where}.delay_s: a delay rule needs delay_s > 0")
        limit = raw.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ValueError(f"{where}.limit: must be an integer, got {limit!r}")
        selectors: dict[str, frozenset] = {}
        for name, kind in _LIST_SELECTORS.items():
            if name not in raw:
                continue
            values = raw[name]
            if not isinstance(values, list) or any(
                isinstance(v, bool) or not isinstance(v, kind) for v in values
            ):
                raise ValueError(f"{where}.{name}: must be a list of {kind.__name__}")
            if name == "chunk_hashes":
                values = [v.lower() for v in values]
            selectors[name] = frozenset(values)
        return cls(action, phase, float(delay_s), selectors, limit)

    def matches(self, key: ObjectKey, position: int, task_ordinal: int, key_ordinal: int) -> bool:
        s = self.selectors
        checks = (
            ("chunk_hashes", lambda: key.chunk_hash.hex()),
            ("ranks", lambda: (key.kv_rank >> 16) & 0xFF),
            ("kv_ranks", lambda: key.kv_rank),
            ("object_groups", lambda: key.object_group_id),
            ("models", lambda: key.model_name),
            ("positions", lambda: position),
            ("tasks", lambda: task_ordinal),
            ("key_ordinals", lambda: key_ordinal),
        )
        return all(name not in s or value() in s[name] for name, value in checks)


def parse_rules(raw: Any) -> list[FaultRule]:
    if not isinstance(raw, list):
        raise ValueError(f"rules: must be a list, got {type(raw).__name__}")
    return [FaultRule.parse(r, f"rules[{i}]") for i, r in enumerate(raw)]


def _rules_of(doc: Any) -> list[FaultRule]:
    """A control file holds {"rules": [...]} (a bare list is accepted too)."""
    if isinstance(doc, dict):
        unknown = sorted(set(doc) - {"rules"})
        if unknown:
            raise ValueError(f"control file: unknown fields {unknown}; expected 'rules'")
        doc = doc.get("rules", [])
    return parse_rules(doc)


def write_control_file(path: str | Path, rules: list[dict]) -> None:
    """Atomically (re)write a control file; the adapter re-arms for the next task submitted."""
    parse_rules(rules)  # refuse to write what the adapter would reject
    write_atomic(Path(path), json.dumps({"rules": rules}).encode())


# ---------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------


class BsrFaultL2AdapterConfig(L2AdapterConfigBase):
    def __init__(
        self,
        inner_config: L2AdapterConfigBase,
        name: str = "default",
        control_path: str | None = None,
        rules: list[dict] | None = None,
        verify: bool = False,
        checksum_dir: str | None = None,
    ) -> None:
        self.inner_config = inner_config  # wrapped adapter (name per LMCache's unwrap helper)
        self.name = name  # registry name for run-time control
        self.control_path = control_path  # JSON rules file, re-read on change
        self.rules = list(rules or [])  # initial rules (validated)
        self.verify = verify  # sha256 at store, checked at load
        self.checksum_dir = checksum_dir  # persisted digests for verify (else memory)
        parse_rules(self.rules)

    @classmethod
    def from_dict(cls, d: dict) -> BsrFaultL2AdapterConfig:
        known = {"type", "inner", "name", "control_path", "rules", "verify", "checksum_dir"}
        known |= {"affinity_tag", "shared", "eviction", "persist_enabled", "serde"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {TYPE_NAME} adapter fields {unknown}")
        inner = d.get("inner")
        if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
            raise ValueError("'inner' must be an adapter spec dict with a string 'type'")
        inner_cls = get_l2_adapter_config_class(inner["type"])
        inner_config = inner_cls.from_dict(inner)
        inner_config.eviction_config = cls._parse_eviction_config(inner)
        inner_config.persist_config = cls._parse_persist_config(inner)
        inner_config.serde_config = cls._parse_serde_config(inner)
        name = d.get("name", "default")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        control_path = d.get("control_path")
        if control_path is not None and not isinstance(control_path, str):
            raise ValueError("control_path must be a string")
        verify = d.get("verify", False)
        if not isinstance(verify, bool):
            raise ValueError("verify must be a boolean")
        checksum_dir = d.get("checksum_dir")
        if checksum_dir is not None and not isinstance(checksum_dir, str):
            raise ValueError("checksum_dir must be a string")
        return cls(inner_config, name, control_path, d.get("rules", []), verify, checksum_dir)

    @classmethod
    def help(cls) -> str:
        return __doc__ or ""


# ---------------------------------------------------------------------------
# adapter
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Submitted:
    """A task whose faults are not decided yet (the pump decides, in submission order)."""

    phase: str
    task_id: L2TaskId
    keys: list[ObjectKey]
    objects: list[Any] | None
    at: float  # monotonic submission time; a delay counts from here


@dataclass
class _Pending:
    keys: list[ObjectKey]
    objects: list[Any] | None  # load buffers (verify), None for lookups
    drop_positions: set[int]
    release_at: float  # monotonic time before which the result is withheld
    bitmap: Any = None  # inner result once collected


@dataclass
class _PhaseState:
    pending: dict[L2TaskId, _Pending] = field(default_factory=dict)
    done: dict[L2TaskId, Any] = field(default_factory=dict)
    task_ordinal: int = 0
    key_ordinal: int = 0


_LIVE: dict[str, weakref.ReferenceType[BsrFaultL2Adapter]] = {}
_LIVE_LOCK = threading.Lock()


class BsrFaultL2Adapter(L2AdapterInterface):
    """Decorator over an inner L2 adapter; lookups and loads pass through a pump thread."""

    def __init__(
        self,
        config: BsrFaultL2AdapterConfig,
        l1_memory_desc: Any = None,
        inner: L2AdapterInterface | None = None,
    ) -> None:
        super().__init__(max_capacity_bytes=0)
        self._inner = inner or create_l2_adapter_from_registry(config.inner_config, l1_memory_desc)
        self._name = config.name
        self._control_path = Path(config.control_path) if config.control_path else None
        self._control_sig: tuple[int, int] | None = None
        self._verify = config.verify
        self._checksum_dir = Path(config.checksum_dir) if config.checksum_dir else None
        if self._checksum_dir is not None:
            self._checksum_dir.mkdir(parents=True, exist_ok=True)
        self._digests: dict[str, str] = {}  # key file name -> checksum line (verify)
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = parse_rules(config.rules)
        self._phases = {p: _PhaseState() for p in PHASES}
        self._submitted: list[_Submitted] = []  # FIFO, drained by the pump under self._lock
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
        with _LIVE_LOCK:
            old = _LIVE.get(self._name)
            if old is not None and old() is not None:
                logger.warning(
                    "fault adapter name %r was already live in this process: run-time control "
                    "now reaches the newest one; give each adapter its own name",
                    self._name,
                )
            _LIVE[self._name] = weakref.ref(self)
        logger.warning(
            "BsrFaultL2Adapter %r ACTIVE over %s (control_path=%s, verify=%s, %d rules)",
            self._name,
            type(self._inner).__name__,
            self._control_path,
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
        if self._control_path is None:
            return
        try:
            st = self._control_path.stat()
            sig: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            sig = None
        except OSError as exc:
            logger.error(
                "fault control file %s unreadable, rules kept: %s", self._control_path, exc
            )
            return
        if sig == self._control_sig:
            return
        self._control_sig = sig
        try:
            rules = [] if sig is None else _rules_of(json.loads(self._control_path.read_text()))
        except (OSError, ValueError) as exc:
            logger.error("fault control file %s rejected, rules kept: %s", self._control_path, exc)
            return
        self._arm(rules)

    def stats(self) -> dict:
        with self._lock:
            out: dict[str, Any] = dict(self._stats)
            out["rules"] = len(self._rules)
            out["events"] = list(self._events)
        return out

    def _record(self, event: dict) -> None:  # holds self._lock
        if len(self._events) < _MAX_RECORDED_EVENTS:
            self._events.append(event)

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
                self._put_digest(key, format_checksum(sha256_hex(buf), len(buf)))
        return self._inner.submit_store_task(keys, objects)

    def pop_completed_store_tasks(self) -> dict:
        return self._inner.pop_completed_store_tasks()

    def _put_digest(self, key: ObjectKey, line: str) -> None:
        name = _object_key_to_filename(key)
        with self._lock:
            self._digests[name] = line
        if self._checksum_dir is not None:
            write_atomic(self._checksum_dir / (name + ".sha256"), line.encode())

    def _get_digest(self, key: ObjectKey) -> tuple[str, int] | None:
        name = _object_key_to_filename(key)
        with self._lock:
            line = self._digests.get(name)
        if line is None and self._checksum_dir is not None:
            try:
                line = (self._checksum_dir / (name + ".sha256")).read_text()
            except OSError:
                line = None
        return parse_checksum(line) if line else None

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
            self._submitted.append(_Submitted(phase, task_id, keys, objects, time.monotonic()))
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

    def _decide(self, sub: _Submitted) -> None:  # holds self._lock
        phase, keys = sub.phase, sub.keys
        state = self._phases[phase]
        task_ordinal = state.task_ordinal
        state.task_ordinal += 1
        first_key_ordinal = state.key_ordinal
        state.key_ordinal += len(keys)
        drops: set[int] = set()
        delay_s = 0.0
        for r, rule in enumerate(self._rules):
            if rule.phase != phase:
                continue
            hit = [
                i
                for i, key in enumerate(keys)
                if rule.matches(key, i, task_ordinal, first_key_ordinal + i)
            ]
            if not hit or rule.limit is not None and rule.limit <= 0:
                continue
            if rule.action == "drop":
                if rule.limit is not None:
                    hit = hit[: rule.limit]
                    self._rules[r] = replace(rule, limit=rule.limit - len(hit))
                drops.update(hit)
            else:
                if rule.limit is not None:
                    self._rules[r] = replace(rule, limit=rule.limit - 1)
                delay_s = max(delay_s, rule.delay_s)
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
        state.pending[sub.task_id] = _Pending(keys, sub.objects, drops, release_at)
        heapq.heappush(self._heap, (release_at, next(self._seq), phase, sub.task_id))

    # ---- pump ----------------------------------------------------------

    def _pump(self) -> None:
        poller = select.poll()
        inner_fds = {
            self._inner.get_lookup_and_lock_event_fd(): "lookup",
            self._inner.get_load_event_fd(): "load",
        }
        for fd in (*inner_fds, self._wake_efd.fileno()):
            poller.register(fd, select.POLLIN)
        while not self._stop.is_set():
            timeout_ms = self._next_timeout_ms()
            try:
                ready = poller.poll(timeout_ms)
            except InterruptedError:
                continue
            for fd, _ in ready:
                try:
                    consume_fd(fd)
                except OSError:
                    pass
            try:
                with self._lock:
                    self._decide_submitted()
                self._collect()
                self._release_due()
            except Exception:
                logger.exception("BsrFaultL2Adapter %r pump error", self._name)

    def _next_timeout_ms(self) -> int:
        with self._lock:
            if self._submitted:
                return 0
            waiting = any(
                p.bitmap is None for s in self._phases.values() for p in s.pending.values()
            )
            if not self._heap:
                return 200
            head = self._heap[0][0]
        if waiting:
            return 20  # inner results are also polled, in case a notify was coalesced
        return max(0, min(200, int((head - time.monotonic()) * 1000) + 1))

    def _collect(self) -> None:
        for phase in PHASES:
            with self._lock:
                todo = [(t, p) for t, p in self._phases[phase].pending.items() if p.bitmap is None]
            for task_id, pending in todo:
                try:
                    if phase == "load":
                        bitmap = self._inner.query_load_result(task_id)
                    else:
                        bitmap = self._inner.query_lookup_and_lock_result(task_id)
                except Exception as exc:
                    bitmap = self._inner_failed(phase, pending, exc)
                else:
                    if bitmap is None:
                        continue
                    try:
                        self._apply_faults(phase, pending, bitmap)
                    except Exception as exc:
                        # reported all misses: what the inner lookup still holds locked
                        # for this task would otherwise stay locked until its TTL
                        self._unlock_hits(phase, pending, bitmap)
                        bitmap = self._inner_failed(phase, pending, exc)
                self._count(phase, pending, bitmap)
                with self._lock:
                    pending.bitmap = bitmap

    def _inner_failed(self, phase: str, pending: _Pending, exc: Exception) -> Bitmap:
        """The contract has no error result: an all-zero bitmap is a task whose every key
        failed. Completing it here records the error once; re-querying every pump pass
        would leave the task (and the caller's window) pending forever."""
        logger.error(
            "BsrFaultL2Adapter %r: inner %s failed, reported as all misses",
            self._name,
            phase,
            exc_info=exc,
        )
        with self._lock:
            self._stats["inner_errors"] += 1
            self._record(
                {"fault": "inner_error", "phase": phase, "error": f"{type(exc).__name__}: {exc}"}
            )
        return Bitmap(len(pending.keys))

    def _count(self, phase: str, pending: _Pending, bitmap: Any) -> None:
        # The tier's own read counters: what it was asked for and what it served (after
        # faults), so an experiment can tell which tier a restore really came from.
        served = len(bitmap.get_indices_list())
        with self._lock:
            self._stats[f"{phase}_keys"] += len(pending.keys)
            self._stats[f"{phase}_hit_keys"] += served

    def _unlock_hits(self, phase: str, pending: _Pending, bitmap: Any) -> None:
        if phase != "lookup":
            return  # loads lock nothing
        try:
            hits = [pending.keys[i] for i in bitmap.get_indices_list()]
            if hits:
                self._inner.submit_unlock(hits)
        except Exception:
            logger.exception("BsrFaultL2Adapter %r: unlock after a failed lookup", self._name)

    def _apply_faults(self, phase: str, pending: _Pending, bitmap: Any) -> None:
        if phase == "lookup":
            # Unlock only what the inner lookup locked (its hits): unlocking a key it did
            # not lock would release another reader's lock.
            hits = set(bitmap.get_indices_list())
            locked = [pending.keys[i] for i in sorted(pending.drop_positions) if i in hits]
            for i in pending.drop_positions:
                bitmap.clear(i)
            if locked:
                self._inner.submit_unlock(locked)
            return
        for i in pending.drop_positions:
            bitmap.clear(i)
        if not self._verify or pending.objects is None:
            return
        for i in bitmap.get_indices_list():
            key = pending.keys[i]
            expected = self._get_digest(key)
            buf = pending.objects[i].byte_array
            if expected is None:
                bitmap.clear(i)
                with self._lock:
                    self._stats["verify_missing"] += 1
                    self._record({"fault": "verify_missing", "chunk_hash": key.chunk_hash.hex()})
                logger.warning("no stored digest for %s: reported as a miss", key)
            elif sha256_hex(buf) != expected[0] or len(buf) != expected[1]:
                bitmap.clear(i)
                with self._lock:
                    self._stats["verify_mismatch"] += 1
                    self._record({"fault": "verify_mismatch", "chunk_hash": key.chunk_hash.hex()})
                logger.warning("checksum mismatch for %s (corrupted object): a miss", key)

    def _release_due(self) -> None:
        now = time.monotonic()
        notify = set()
        with self._lock:
            deferred = []
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)
                _, _, phase, task_id = entry
                pending = self._phases[phase].pending.get(task_id)
                if pending is None:
                    continue
                if pending.bitmap is None:  # inner not finished yet: retry later
                    deferred.append(entry)
                    continue
                del self._phases[phase].pending[task_id]
                self._phases[phase].done[task_id] = pending.bitmap
                notify.add(phase)
            for entry in deferred:
                heapq.heappush(self._heap, entry)
        if "lookup" in notify:
            self._lookup_efd.notify()
        if "load" in notify:
            self._load_efd.notify()

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
            "pump_alive": self._pump_thread.is_alive(),
            **{k: v for k, v in self.stats().items() if k != "events"},
        }
        status["is_healthy"] = bool(status.get("is_healthy", True)) and (
            self._pump_thread.is_alive()
        )
        return status

    def close(self) -> None:
        self._stop.set()
        self._wake_efd.notify()
        self._pump_thread.join(timeout=5)
        with _LIVE_LOCK:
            ref = _LIVE.get(self._name)
            if ref is not None and ref() is self:
                del _LIVE[self._name]
        self._inner.close()
        for efd in (self._lookup_efd, self._load_efd, self._wake_efd):
            efd.close()


# ---------------------------------------------------------------------------
# run-time control: plain functions over this process's live adapters
# ---------------------------------------------------------------------------


def _live(name: str) -> BsrFaultL2Adapter:
    with _LIVE_LOCK:
        ref = _LIVE.get(name)
        names = sorted(_LIVE)
    adapter = ref() if ref else None
    if adapter is None:
        raise KeyError(f"no live fault adapter named {name!r}; live: {names}")
    return adapter


def fault_adapter_names() -> list[str]:
    with _LIVE_LOCK:
        return sorted(n for n, r in _LIVE.items() if r() is not None)


def set_fault_rules(rules: list[dict], name: str = "default") -> None:
    _live(name).set_rules(rules)


def clear_fault_rules(name: str = "default") -> None:
    _live(name).set_rules([])


def fault_stats(name: str = "default") -> dict:
    return _live(name).stats()


def handle_control(payload: bytes) -> bytes:
    """Bytes in, bytes out (JSON), for a ``server_module_handler``; never raises."""
    try:
        req = json.loads(payload or b"{}")
        op = req.get("op", "stats")
        name = req.get("name", "default")
        if op == "set":
            set_fault_rules(req.get("rules", []), name)
        elif op == "clear":
            clear_fault_rules(name)
        elif op == "list":
            return json.dumps({"ok": True, "names": fault_adapter_names()}).encode()
        elif op != "stats":
            raise ValueError(f"op {op!r}: expected set, clear, stats or list")
        return json.dumps({"ok": True, "stats": fault_stats(name)}).encode()
    except Exception as exc:  # a raising handler hangs vLLM: report instead
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode()


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------


def _create(config: L2AdapterConfigBase, l1_memory_desc: Any = None) -> L2AdapterInterface:
    assert isinstance(config, BsrFaultL2AdapterConfig)
    return BsrFaultL2Adapter(config, l1_memory_desc)


def _register() -> None:
    try:
        register_l2_adapter_type(TYPE_NAME, BsrFaultL2AdapterConfig)
        register_l2_adapter_factory(TYPE_NAME, _create)
    except ValueError:
        pass


_register()

__all__ = [
    "BsrFaultL2Adapter",
    "BsrFaultL2AdapterConfig",
    "FaultRule",
    "clear_fault_rules",
    "fault_adapter_names",
    "fault_stats",
    "handle_control",
    "parse_rules",
    "set_fault_rules",
    "write_control_file",
]
