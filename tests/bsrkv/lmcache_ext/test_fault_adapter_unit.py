"""The fault adapter's own mechanics over a fake inner adapter: no StorageManager, no server."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.api import ObjectKey

from bsrkv.lmcache_ext.faults.adapter import BsrFaultL2Adapter, BsrFaultL2AdapterConfig
from bsrkv.lmcache_ext.faults.control import fault_stats, write_control_file
from bsrkv.lmcache_ext.faults.rules import FaultRule


class FakeInner:
    """Completes every task at once as all hits, or raises from its query if told to."""

    def __init__(self) -> None:
        self._fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(3)]
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}  # task id -> number of keys
        self.fail_ids: set[int] = set()  # these task ids raise from their query
        self.miss_positions: set[int] = set()  # key positions every task reports missing
        self.unlock_failures = 0  # the next N submit_unlock calls raise
        self.queries: dict[int, int] = {}  # task id -> query calls
        self.unlocked: list[ObjectKey] = []

    def _submit(self, keys: list[ObjectKey]) -> int:
        with self._lock:
            task_id = next(self._ids)
            self._open[task_id] = len(keys)
        return task_id

    def _query(self, task_id: int) -> Bitmap | None:
        with self._lock:
            self.queries[task_id] = self.queries.get(task_id, 0) + 1
            if task_id in self.fail_ids:
                raise RuntimeError(f"inner broke on task {task_id}")
            n = self._open.pop(task_id, None)
        if n is None:
            return None
        bitmap = Bitmap(n)
        for i in range(n):
            if i not in self.miss_positions:
                bitmap.set(i)
        return bitmap

    def get_store_event_fd(self) -> int:
        return self._fds[0]

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._fds[1]

    def get_load_event_fd(self) -> int:
        return self._fds[2]

    def submit_lookup_and_lock_task(self, keys: list[ObjectKey], descs: dict) -> int:
        return self._submit(keys)

    def query_lookup_and_lock_result(self, task_id: int) -> Bitmap | None:
        return self._query(task_id)

    def submit_load_task(self, keys: list[ObjectKey], objects: list[Any]) -> int:
        return self._submit(keys)

    def query_load_result(self, task_id: int) -> Bitmap | None:
        return self._query(task_id)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        if self.unlock_failures:
            self.unlock_failures -= 1
            raise RuntimeError("unlock broke")
        self.unlocked.extend(keys)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


class SpyPath:
    """A control path that counts stat() calls; its reads can be slowed to widen races."""

    def __init__(self, path: Path, stat_delay_s: float = 0.0, read_delay_s: float = 0.0) -> None:
        self.path = path
        self.stat_delay_s = stat_delay_s
        self.read_delay_s = read_delay_s
        self.stats = 0

    def stat(self) -> os.stat_result:
        self.stats += 1
        time.sleep(self.stat_delay_s)
        return self.path.stat()

    def read_text(self) -> str:
        time.sleep(self.read_delay_s)
        return self.path.read_text()

    def __str__(self) -> str:
        return str(self.path)


def keys(n: int, salt: str = "k") -> list[ObjectKey]:
    return [
        ObjectKey(chunk_hash=f"{salt}{i}".encode().ljust(16, b"."), model_name="m", kv_rank=0)
        for i in range(n)
    ]


def submit(adapter: BsrFaultL2Adapter, phase: str, ks: list[ObjectKey]) -> int:
    if phase == "load":
        return adapter.submit_load_task(ks, [None] * len(ks))
    return adapter.submit_lookup_and_lock_task(ks, {})


def result(adapter: BsrFaultL2Adapter, phase: str, task_id: int, timeout_s: float = 3.0) -> list:
    query = adapter.query_load_result if phase == "load" else adapter.query_lookup_and_lock_result
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        bitmap = query(task_id)
        if bitmap is not None:
            return bitmap.get_indices_list()
        time.sleep(0.005)
    raise AssertionError(f"{phase} task {task_id} still pending after {timeout_s} s")


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[BsrFaultL2Adapter] = []

    def build(name: str, **extra: Any) -> tuple[BsrFaultL2Adapter, FakeInner]:
        config = BsrFaultL2AdapterConfig.from_dict(
            {"type": "bsr_fault", "name": name, "inner": {"type": "fs", "base_path": "."}, **extra}
        )
        inner = FakeInner()
        adapter = BsrFaultL2Adapter(config, inner=inner)  # type: ignore[arg-type]
        made.append(adapter)
        return adapter, inner

    yield build
    for adapter in made:
        adapter.close()


@pytest.mark.parametrize("phase", ["lookup", "load"])
def test_inner_query_error_completes_the_task_as_a_miss_once(make, phase: str) -> None:
    adapter, inner = make(f"err-{phase}")
    inner.fail_ids.add(0)  # the first task's query raises
    bad = submit(adapter, phase, keys(3))
    good = submit(adapter, phase, keys(2, "g"))
    assert result(adapter, phase, bad) == []  # all-zero bitmap: every key failed
    assert result(adapter, phase, good) == [0, 1]  # one broken task blocks no other
    for later in range(2):  # two more pump passes, each proven by the task it completed
        assert result(adapter, phase, submit(adapter, phase, keys(1, f"p{later}"))) == [0]
    assert inner.queries[bad] == 1  # the broken task was not queried again in them
    assert inner.unlocked == []  # nothing reported locked, nothing to unlock
    stats = adapter.stats()
    assert stats["inner_errors"] == 1
    assert (stats[f"{phase}_keys"], stats[f"{phase}_hit_keys"]) == (7, 4)  # 5 + 2, 2 + 2
    errors = [e for e in stats["events"] if e["fault"] == "inner_error"]
    assert errors == [
        {"fault": "inner_error", "phase": phase, "error": "RuntimeError: inner broke on task 0"}
    ]


def test_a_control_file_change_arms_once_under_concurrent_submits(make, tmp_path: Path) -> None:
    control = tmp_path / "faults.json"
    adapter, _ = make("race", control_path=str(control))
    # a slow reload: an unlocked check in the other thread still sees the old signature
    spy = SpyPath(control, read_delay_s=0.1)
    adapter._control.path = spy  # type: ignore[union-attr,assignment]
    armed = adapter.stats()["rules_armed"]
    write_control_file(control, [{"action": "drop", "phase": "lookup", "tasks": [0]}])
    got: dict[int, list] = {}

    def one(i: int) -> None:
        got[i] = result(adapter, "lookup", submit(adapter, "lookup", keys(1, f"t{i}")))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert adapter.stats()["rules_armed"] == armed + 1
    assert sorted(len(hits) for hits in got.values()) == [0, 1]  # task 0 only: one drop


def test_control_file_stat_is_throttled_yet_prompt(make, tmp_path: Path) -> None:
    control = tmp_path / "faults.json"
    adapter, _ = make("throttle", control_path=str(control))
    spy = SpyPath(control, stat_delay_s=0.02)
    adapter._control.path = spy  # type: ignore[union-attr,assignment]
    # The burst queues before the pump wakes (its per-submit wake-ups held back, one after),
    # so how the pump and this thread interleave on a loaded machine cannot split it: the
    # pump then decides the whole queue with one control-file check, never one per task.
    wake, held = adapter._wake_efd.notify, []
    adapter._wake_efd.notify = lambda: held.append(1)  # type: ignore[method-assign]
    try:
        burst = [submit(adapter, "lookup", keys(1, f"b{i}")) for i in range(20)]
    finally:
        adapter._wake_efd.notify = wake  # type: ignore[method-assign]
    assert len(held) == 20  # every submission asks for a wake-up
    wake()
    assert [result(adapter, "lookup", t) for t in burst] == [[0]] * 20
    assert spy.stats <= 5  # not one per task (1 + any timed wake-up of the pump meanwhile)
    # a change written before a task is submitted still applies to that very task
    write_control_file(control, [{"action": "drop", "phase": "lookup"}])
    assert result(adapter, "lookup", submit(adapter, "lookup", keys(2, "p"))) == []
    write_control_file(control, [])
    assert result(adapter, "lookup", submit(adapter, "lookup", keys(2, "q"))) == [0, 1]


def test_fault_rule_is_frozen_and_a_limit_is_spent_by_replacement(make) -> None:
    rule = FaultRule.parse({"action": "drop", "phase": "lookup", "limit": 2})
    with pytest.raises(AttributeError):
        rule.limit = 0  # type: ignore[misc]
    adapter, _ = make("limit")
    adapter.set_rules([{"action": "drop", "phase": "lookup", "limit": 2}])
    assert result(adapter, "lookup", submit(adapter, "lookup", keys(3))) == [2]
    assert result(adapter, "lookup", submit(adapter, "lookup", keys(3, "n"))) == [0, 1, 2]
    assert adapter.stats()["dropped_keys"] == 2


def test_a_dropped_lookup_key_is_unlocked_only_if_the_inner_locked_it(make) -> None:
    adapter, inner = make("unlock-own")
    inner.miss_positions = {1}  # the inner lookup misses (never locks) position 1
    adapter.set_rules([{"action": "drop", "phase": "lookup"}])  # drop every key
    ks = keys(3, "u")
    assert result(adapter, "lookup", submit(adapter, "lookup", ks)) == []
    assert inner.unlocked == [ks[0], ks[2]]  # not ks[1]: another reader may hold that lock


def test_a_lookup_failing_after_the_inner_locked_unlocks_its_hits(make) -> None:
    # The inner lookup locks all three keys; our fault step then fails (its unlock of the
    # dropped key raises): the task is all misses and every key the inner locked is
    # unlocked, rather than held until LMCache's lock TTL.
    adapter, inner = make("unlock-on-error")
    adapter.set_rules([{"action": "drop", "phase": "lookup", "positions": [0]}])
    inner.unlock_failures = 1
    ks = keys(3, "e")
    assert result(adapter, "lookup", submit(adapter, "lookup", ks)) == []
    assert inner.unlocked == [ks[1], ks[2]]  # position 0's unlock is the one that raised
    assert adapter.stats()["inner_errors"] == 1


def test_close_twice_is_a_no_op(make) -> None:
    # LMCache's own adapters tolerate a second close(); this one raised ValueError from its
    # closed wake eventfd (found by LMCache 0.5.6's L2-adapter checks).
    adapter, _ = make("close-twice")
    adapter.close()
    adapter.close()
    assert not adapter._pump_thread.is_alive()
    with pytest.raises(KeyError, match="close-twice"):
        fault_stats("close-twice")  # no longer reachable by name
