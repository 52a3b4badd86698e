"""One storage device's schedule, pure (no clock, no LMCache): the simulated staging device
(``sim/device.py``), the shaped L2 tier (``lmcache_ext.faults``, through
``lmcache_ext.adapters.shaping``) and the live stack's progress estimate
(``lmcache_ext.tempokv.device``) all run on it.

The device serves up to `slots` ops at once (None: all), in submission order; the rest wait,
first come first served. Each op in service first spends ``latency_s`` (it holds its slot
and moves nothing), then moves its bytes at an equal share of one aggregate rate that falls
as more ops move, ``bandwidth / (1 + contention·(n − 1))`` (processor sharing; the sim's
calibration of the two numbers is in ``sim/device.py``). The shaped L2 is one slot with a
latency and no contention: op k starts at max(submitted_k, done_{k−1}) and takes
``latency_s + bytes / bandwidth`` (``admit``, the closed form of that case); the simulated
device is every op in service, no latency, with contention.

Times are passed in (seconds on the caller's clock) and never go backwards."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SHAPE_FIELDS = ("bandwidth_bytes_s", "latency_s")


@dataclass(frozen=True, slots=True)
class DeviceShape:
    bandwidth_bytes_s: float  # one op alone, bytes per second
    latency_s: float = 0.0  # fixed cost per op (seek, submission)

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_s > 0 and math.isfinite(self.bandwidth_bytes_s)):
            raise ValueError(
                f"shape.bandwidth_bytes_s: {self.bandwidth_bytes_s!r}, must be a positive number"
            )
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ValueError(f"shape.latency_s: {self.latency_s!r}, must be ≥ 0")

    def service_s(self, size_bytes: int) -> float:
        return self.latency_s + size_bytes / self.bandwidth_bytes_s

    @classmethod
    def parse(cls, raw: Any) -> DeviceShape | None:
        """From the wrapper's ``shape`` field (None/absent: unshaped)."""
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ValueError("shape: must be an object {bandwidth_bytes_s, latency_s}")
        unknown = sorted(set(raw) - set(SHAPE_FIELDS))
        if unknown:
            raise ValueError(f"shape: unknown fields {unknown}; known: {list(SHAPE_FIELDS)}")
        if "bandwidth_bytes_s" not in raw:
            raise ValueError("shape.bandwidth_bytes_s: required (bytes per second)")
        return cls(float(raw["bandwidth_bytes_s"]), float(raw.get("latency_s", 0.0)))

    def to_json(self) -> dict[str, float]:
        return {"bandwidth_bytes_s": self.bandwidth_bytes_s, "latency_s": self.latency_s}


@dataclass(frozen=True, slots=True)
class ShapedOp:
    size_bytes: int
    submitted_s: float  # when the caller submitted the load
    start_s: float  # when the shaped device took it (FIFO)
    done_s: float  # when its result may be reported

    def to_json(self) -> dict[str, float | int]:
        return {
            "size_bytes": self.size_bytes,
            "submitted_s": round(self.submitted_s, 6),
            "start_s": round(self.start_s, 6),
            "done_s": round(self.done_s, 6),
        }


class ShapingSchedule:
    """The device above. Two ways to drive it, never mixed on one schedule:

    - ``admit`` (one slot, no contention: the shaped L2's wrapper): each op's start and done
      are fixed when it is submitted, since no later op can move an earlier one;
    - ``start`` / ``advance`` / ``drop`` (any device): the caller starts ops, asks when the
      next one ends (``next_event_s``), and moves the schedule to a time, which returns the
      ops done by then. ``drop`` takes an op out early (it ended elsewhere)."""

    def __init__(
        self,
        shape: DeviceShape,
        keep: int = 4096,
        slots: int | None = 1,
        contention: float = 0.0,
    ) -> None:
        self.shape = shape
        self.slots = slots
        self.contention = contention
        self._free_at_s = -math.inf
        self._keep = keep
        self.ops: list[ShapedOp] = []  # admitted: the first `keep`, for the evidence
        self.total_ops = 0
        self.total_bytes = 0
        self._left: dict[int, float] = {}  # moving bytes: bytes left as of _last_s
        self._latent: dict[int, tuple[float, int]] = {}  # in its latency: (ends at, bytes)
        self._queue: dict[int, int] = {}  # waiting for a slot, submission order: bytes
        self._last_s = -math.inf

    # ---- one slot: closed form --------------------------------------------------------
    def admit(self, submitted_s: float, size_bytes: int) -> ShapedOp:
        """Op k starts at max(submitted_k, done_{k−1}) and is done ``service_s(bytes)``
        later. Admit ops in submission order (the wrapper's pump does)."""
        if self.slots != 1 or self.contention:
            raise ValueError("admit: the closed form holds for one slot without contention")
        start_s = max(submitted_s, self._free_at_s)
        done_s = start_s + self.shape.service_s(size_bytes)
        self._free_at_s = done_s
        op = ShapedOp(size_bytes, submitted_s, start_s, done_s)
        self.total_ops += 1
        self.total_bytes += size_bytes
        if len(self.ops) < self._keep:
            self.ops.append(op)
        return op

    # ---- any device: events -----------------------------------------------------------
    def aggregate_bytes_s(self, moving: int) -> float:
        return self.shape.bandwidth_bytes_s / (1.0 + self.contention * max(0, moving - 1))

    def start(self, op_id: int, now_s: float, size_bytes: int) -> None:
        """Submit an op now: into service if a slot is free, else at the queue's tail."""
        self._move(now_s)
        self._queue[op_id] = size_bytes
        self._fill(now_s)

    def remaining_bytes(self, op_id: int, now_s: float) -> int:
        """Bytes the op has still to move at now_s, with no event between the last one
        and now_s (``advance`` first otherwise); 0 for an op not on the device."""
        left = self._left.get(op_id)
        if left is not None:
            return max(0, int(left - (now_s - self._last_s) * self._per_op_bytes_s()))
        waiting = self._queue.get(op_id)
        if waiting is not None:
            return waiting
        latent = self._latent.get(op_id)
        return latent[1] if latent is not None else 0

    def next_event_s(self) -> float | None:
        """When the next op ends its latency or its bytes (None: nothing in service)."""
        at_s = min((end_s for end_s, _ in self._latent.values()), default=math.inf)
        if self._left:
            first = min(self._left.values())
            at_s = min(at_s, self._last_s + max(0.0, first) / self._per_op_bytes_s())
        return None if at_s == math.inf else at_s

    def advance(self, now_s: float) -> list[int]:
        """Move to now_s through every event before it; the ops done, in the order they
        ended (op id order within one instant)."""
        done: list[int] = []
        while True:
            at_s = self.next_event_s()
            if at_s is None or at_s > now_s:
                break
            self._move(at_s)
            ended = sorted(op_id for op_id, left in self._left.items() if left <= 1.0)
            for op_id in ended:
                del self._left[op_id]
            latent = sorted(op_id for op_id, (end_s, _) in self._latent.items() if end_s <= at_s)
            for op_id in latent:
                self._left[op_id] = float(self._latent.pop(op_id)[1])
            done.extend(ended)
            self._fill(at_s)
            if not ended and not latent:
                break  # an end too close to tell from now: the next move settles it
        self._move(now_s)
        return done

    def drop(self, op_id: int, now_s: float) -> None:
        """The op ended elsewhere (done, or abandoned): off the device at now_s."""
        self._move(now_s)
        self._left.pop(op_id, None)
        self._latent.pop(op_id, None)
        self._queue.pop(op_id, None)
        self._fill(now_s)

    def in_service(self) -> int:
        return len(self._left) + len(self._latent)

    def _per_op_bytes_s(self) -> float:
        n = len(self._left)
        return self.aggregate_bytes_s(n) / n if n else 0.0

    def _move(self, now_s: float) -> None:
        moved = (now_s - self._last_s) * self._per_op_bytes_s() if self._left else 0.0
        if moved:
            for op_id in self._left:
                self._left[op_id] -= moved
        self._last_s = max(self._last_s, now_s)

    def _fill(self, now_s: float) -> None:
        """Queued ops into the free slots, in submission order."""
        while self._queue and (self.slots is None or self.in_service() < self.slots):
            op_id = next(iter(self._queue))
            size = self._queue.pop(op_id)
            if self.shape.latency_s > 0:
                self._latent[op_id] = (now_s + self.shape.latency_s, size)
            else:
                self._left[op_id] = float(size)
