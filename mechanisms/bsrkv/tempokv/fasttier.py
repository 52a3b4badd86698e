"""The fast tier's bookkeeping: residency in LRU order, per-object protection refcounts and
the reserved bytes P(t) they add up to (shared objects counted once), integrated over time."""

from __future__ import annotations

from collections import OrderedDict

from bsrkv.tempokv.kv import KvObject


class ByteTimeMeter:
    """∫ P(t) dt in byte·seconds, plus the step trace of P(t) and its peak."""

    def __init__(self, start_s: float = 0.0, keep_trace: bool = True) -> None:
        self.last_s = start_s
        self.level_bytes = 0
        self.integral_byte_s = 0.0
        self.peak_bytes = 0
        self.trace: list[tuple[float, int]] | None = [(start_s, 0)] if keep_trace else None

    def set(self, now_s: float, level_bytes: int) -> None:
        self.integral_byte_s += self.level_bytes * (now_s - self.last_s)
        self.last_s = now_s
        self.level_bytes = level_bytes
        self.peak_bytes = max(self.peak_bytes, level_bytes)
        if self.trace is not None:
            self.trace.append((now_s, level_bytes))


class FastTier:
    """Capacity is shared by protected and ordinary cached objects; only unprotected,
    unpinned objects are evictable. Nothing here issues I/O."""

    def __init__(self, capacity_bytes: int, budget_bytes: int, meter: ByteTimeMeter) -> None:
        if not 0 < budget_bytes <= capacity_bytes:
            raise ValueError(
                f"protected budget {budget_bytes} B must be in (0, capacity {capacity_bytes} B]"
            )
        self.capacity_bytes = capacity_bytes
        self.budget_bytes = budget_bytes
        self.meter = meter
        self.resident: OrderedDict[str, int] = OrderedDict()  # oldest first
        self.resident_bytes = 0
        self.inflight_bytes = 0  # space held by running staging reads
        self.protect_refs: dict[str, int] = {}  # committed claims protecting each object
        self.pins: dict[str, int] = {}  # ordinary retrievals reading each object now
        self.reserved_bytes = 0  # P(t): protected objects + reservations for their staging
        self.evictions = 0

    def is_resident(self, object_id: str) -> bool:
        return object_id in self.resident

    def protected(self, object_id: str) -> bool:
        return self.protect_refs.get(object_id, 0) > 0

    def unprotected_bytes(self, objects: list[KvObject]) -> int:
        return sum(o.size_bytes for o in objects if not self.protected(o.object_id))

    def protect(self, objects: list[KvObject], now_s: float) -> None:
        for obj in objects:
            refs = self.protect_refs.get(obj.object_id, 0)
            if refs == 0:
                self.reserved_bytes += obj.size_bytes
            self.protect_refs[obj.object_id] = refs + 1
        self.meter.set(now_s, self.reserved_bytes)

    def unprotect(self, objects: list[KvObject], now_s: float) -> int:
        """Drop one reference per object; returns the bytes whose protection ended."""
        freed = 0
        for obj in objects:
            refs = self.protect_refs[obj.object_id] - 1
            if refs == 0:
                del self.protect_refs[obj.object_id]
                self.reserved_bytes -= obj.size_bytes
                freed += obj.size_bytes
            else:
                self.protect_refs[obj.object_id] = refs
        self.meter.set(now_s, self.reserved_bytes)
        return freed

    def pin(self, objects: list[KvObject]) -> None:
        for obj in objects:
            self.pins[obj.object_id] = self.pins.get(obj.object_id, 0) + 1

    def unpin(self, objects: list[KvObject]) -> None:
        for obj in objects:
            refs = self.pins[obj.object_id] - 1
            if refs:
                self.pins[obj.object_id] = refs
            else:
                del self.pins[obj.object_id]

    def touch(self, objects: list[KvObject]) -> None:
        for obj in objects:
            if obj.object_id in self.resident:
                self.resident.move_to_end(obj.object_id)

    def make_room(self, size_bytes: int) -> bool:
        """Evict least-recently-used evictable objects until size_bytes fit. False (and
        nothing evicted) if they cannot fit even after evicting every evictable object."""
        free = self.capacity_bytes - self.resident_bytes - self.inflight_bytes
        if free >= size_bytes:
            return True
        victims: list[str] = []
        for object_id, obj_bytes in self.resident.items():
            if object_id in self.protect_refs or object_id in self.pins:
                continue
            victims.append(object_id)
            free += obj_bytes
            if free >= size_bytes:
                break
        if free < size_bytes:
            return False
        for object_id in victims:
            self.resident_bytes -= self.resident.pop(object_id)
            self.evictions += 1
        return True

    def insert(self, obj: KvObject) -> None:
        if obj.object_id not in self.resident:
            self.resident[obj.object_id] = obj.size_bytes
            self.resident_bytes += obj.size_bytes
        else:
            self.resident.move_to_end(obj.object_id)
