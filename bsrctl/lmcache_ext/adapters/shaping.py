"""Device shaping for an L2 tier: each load costs what the spec's device says, not what the
page cache makes it cost.

On these machines an FS tier is served from memory, so staging would be free. The fault
wrapper (``bsrctl.lmcache_ext.faults.adapter``) takes a ``shape`` ({"bandwidth_bytes_s",
"latency_s"}) and withholds each load's result until the schedule below says the device
finished it: one queue, first come first served (the provider's concurrency 1), each op
taking ``latency_s + bytes / bandwidth_bytes_s`` from when the device is free. The real
read still happens (and must be done by then: a result is never released before the inner
adapter's), so a shaped tier is never faster than the real one, only slower.

Pure: no LMCache, so the schedule is tested to the byte and the second in virtual time.
"""

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
    """A single FIFO device: op k starts at max(submitted_k, done_{k-1}) and is done
    ``service_s(bytes)`` later. Admit ops in submission order (the wrapper's pump does)."""

    def __init__(self, shape: DeviceShape, keep: int = 4096) -> None:
        self.shape = shape
        self._free_at_s = -math.inf
        self._keep = keep
        self.ops: list[ShapedOp] = []  # the first `keep`, for the evidence
        self.total_ops = 0
        self.total_bytes = 0

    def admit(self, submitted_s: float, size_bytes: int) -> ShapedOp:
        start_s = max(submitted_s, self._free_at_s)
        done_s = start_s + self.shape.service_s(size_bytes)
        self._free_at_s = done_s
        op = ShapedOp(size_bytes, submitted_s, start_s, done_s)
        self.total_ops += 1
        self.total_bytes += size_bytes
        if len(self.ops) < self._keep:
            self.ops.append(op)
        return op
