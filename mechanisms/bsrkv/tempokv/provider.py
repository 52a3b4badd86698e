"""The storage-side staging provider: commitment (validity + protected-capacity checks),
coalesced SSD→fast-tier staging in issue order, protection lifecycle, ordinary reads, and
the queue view TTR is estimated from."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from bsrkv.clock import Clock
from bsrkv.tempokv.fasttier import ByteTimeMeter, FastTier
from bsrkv.tempokv.kv import KvObject, Manifest
from bsrkv.tempokv.ttr import OpView, RateMeter, TtrQuery, project_finish_s


class CommitRefusal(IntEnum):
    INVALID = 1  # an object is neither stored nor resident: nothing to stage
    CAPACITY = 2  # the claim's unprotected bytes do not fit in the protected budget now


@dataclass(frozen=True, slots=True)
class CommitDecision:
    claim_id: str
    refusal: CommitRefusal | None  # None: committed
    extra_reserved_bytes: int  # bytes this commit newly protects (not covered by others)
    read_bytes: int  # SSD bytes newly issued for it
    ready: bool  # every object already resident and protected at commit
    detail: str = ""  # with the numbers, when refused

    @property
    def ok(self) -> bool:
        return self.refusal is None


class OpKind(IntEnum):
    STAGE = 0  # for committed claims: protected, reserved
    ORDINARY = 1  # demand read for an uncommitted claim: nothing reserved


class StagingDevice(Protocol):
    """SSD→fast-tier reads. The sim implements it; the real device will too."""

    def start(self, op_id: int, size_bytes: int, on_done: Callable[[int], None]) -> None: ...

    def remaining_bytes(self, op_id: int) -> int: ...


@dataclass(slots=True)
class _Op:
    op_id: int
    kind: OpKind
    objects: list[KvObject]
    size_bytes: int
    running: bool = False
    bypass: bool = False  # ordinary read streamed through without room to cache it
    start_s: float = 0.0  # issued to the device
    share_at_start_s: float = 0.0  # the provider's ∫ 1/n dt when it was issued


@dataclass(slots=True)
class _Commitment:
    objects: list[KvObject]  # deduplicated, manifest order
    pending_ops: set[int]
    cancel_pending: bool = False


@dataclass(slots=True)
class _Read:
    objects: list[KvObject]
    pending_ops: set[int]
    on_done: Callable[[], None]
    pinned: list[KvObject] = field(default_factory=list)


def _unique(objects: Iterable[KvObject]) -> list[KvObject]:
    seen: set[str] = set()
    out = []
    for obj in objects:
        if obj.object_id not in seen:
            seen.add(obj.object_id)
            out.append(obj)
    return out


class StagingProvider:
    def __init__(
        self,
        clock: Clock,
        device: StagingDevice,
        capacity_bytes: int,
        budget_bytes: int,
        concurrency: int,
        rate: RateMeter,
        keep_trace: bool = True,
    ) -> None:
        self.clock = clock
        self.device = device
        self.concurrency = concurrency
        self.rate = rate
        self.tier = FastTier(capacity_bytes, budget_bytes, ByteTimeMeter(clock.now(), keep_trace))
        self.stored: set[str] = set()  # objects on SSD
        self._ops: dict[int, _Op] = {}  # issue order (dicts keep insertion order)
        self._object_op: dict[str, int] = {}  # object being read -> its op (coalescing)
        self._commitments: dict[str, _Commitment] = {}
        self._reads: dict[str, _Read] = {}
        self._next_op = 0
        # Device load as the provider sees it (ops it has issued and not seen complete):
        # ∫ 1/n(t) dt over busy time, from which each op's share of the device follows.
        self._running = 0
        self._share_s = 0.0
        self._share_at_s = clock.now()
        self.version = 0  # bumps on every change TTR could see
        self._classified: dict[int, tuple[Manifest, int, tuple[frozenset[int], int, int]]] = {}
        self.on_ready: Callable[[str], None] = lambda claim_id: None
        self.on_change: Callable[[], None] = lambda: None
        self.read_bytes_total = 0
        self._eta_cache: tuple[tuple[int, float], dict[int, float]] | None = None

    # ---- what is where ------------------------------------------------------------------
    def store(self, objects: Iterable[KvObject]) -> None:
        self.stored.update(o.object_id for o in objects)

    def is_ready(self, claim_id: str) -> bool:
        c = self._commitments.get(claim_id)
        return c is not None and not c.pending_ops

    def ttr_query(self, manifest: Manifest) -> TtrQuery:
        deps_ops, new_bytes, missing_bytes = self._classify(manifest)
        index = {op_id: i for i, op_id in enumerate(self._ops)}
        ops = tuple(
            OpView(
                self.device.remaining_bytes(op.op_id) if op.running else op.size_bytes,
                op.running,
                op.kind is OpKind.STAGE,
            )
            for op in self._ops.values()
        )
        deps = frozenset(index[op_id] for op_id in deps_ops)
        return TtrQuery(ops, deps, new_bytes, missing_bytes, self.concurrency)

    def _classify(self, manifest: Manifest) -> tuple[frozenset[int], int, int]:
        """Which ops the manifest waits on, bytes to read anew, bytes not resident. Cached
        until the provider's state changes (the per-object walk is the costly part)."""
        hit = self._classified.get(id(manifest))
        if hit is not None and hit[0] is manifest and hit[1] == self.version:
            return hit[2]
        deps: set[int] = set()
        new_bytes = missing_bytes = 0
        for obj in manifest.objects:
            if self.tier.is_resident(obj.object_id):
                continue  # needs protection, not a read
            missing_bytes += obj.size_bytes
            op_id = self._object_op.get(obj.object_id)
            if op_id is None or self._ops[op_id].bypass:  # commit() would read it anew
                new_bytes += obj.size_bytes
            else:
                deps.add(op_id)
        out = (frozenset(deps), new_bytes, missing_bytes)
        self._classified[id(manifest)] = (manifest, self.version, out)
        return out

    def unstaged_objects(self, manifest: Manifest) -> list[KvObject]:
        """Objects a commitment now would read anew: neither resident nor covered by a
        staging or demand read already issued (one streaming through without room counts
        as not covering)."""
        out = []
        for obj in manifest.objects:
            if self.tier.is_resident(obj.object_id):
                continue
            op_id = self._object_op.get(obj.object_id)
            if op_id is None or self._ops[op_id].bypass:
                out.append(obj)
        return out

    def staging_slot_free(self) -> bool:
        """Would a staging op issued now start at once (fewer than `concurrency` staging
        ops outstanding, running or queued)?"""
        outstanding = sum(1 for op in self._ops.values() if op.kind is OpKind.STAGE)
        return outstanding < self.concurrency

    # ---- commitment ---------------------------------------------------------------------
    def commit(self, claim_id: str, manifest: Manifest) -> CommitDecision:
        """Check validity and capacity before changing anything; then protect what is
        resident, join staging already under way, and read the rest in one new op."""
        if claim_id in self._commitments:
            raise RuntimeError(f"claim {claim_id} is already committed")
        objects = _unique(manifest.objects)
        unknown = [
            o.object_id
            for o in objects
            if o.object_id not in self.stored and not self.tier.is_resident(o.object_id)
        ]
        if unknown:
            return CommitDecision(
                claim_id, CommitRefusal.INVALID, 0, 0, False, f"{len(unknown)} objects unknown"
            )
        extra_bytes = self.tier.unprotected_bytes(objects)
        tier = self.tier
        if tier.reserved_bytes + extra_bytes > tier.budget_bytes:
            return CommitDecision(
                claim_id,
                CommitRefusal.CAPACITY,
                0,
                0,
                False,
                f"reserved {tier.reserved_bytes} B + {extra_bytes} B"
                f" > budget {tier.budget_bytes} B",
            )
        now_s = self.clock.now()
        tier.protect(objects, now_s)
        tier.touch(objects)
        pending: set[int] = set()
        to_read = []
        for obj in objects:
            if tier.is_resident(obj.object_id):
                continue
            op_id = self._object_op.get(obj.object_id)
            if op_id is None or self._ops[op_id].bypass:
                # a demand read streaming through without room caches nothing: read again
                to_read.append(obj)
            else:
                pending.add(op_id)
        read_bytes = sum(o.size_bytes for o in to_read)
        if to_read:
            pending.add(self._issue(OpKind.STAGE, to_read))
        self._commitments[claim_id] = _Commitment(objects, pending)
        self._changed()
        self._start_ops()
        return CommitDecision(claim_id, None, extra_bytes, read_bytes, not pending)

    def release(self, claim_id: str) -> int:
        """End protection on this claim's behalf. Returns bytes whose protection ended
        (objects still protected by another committed claim stay protected)."""
        c = self._commitments[claim_id]
        if c.pending_ops:  # staging I/O may still use the objects: keep them until it ends
            c.cancel_pending = True
            return 0
        del self._commitments[claim_id]
        freed = self.tier.unprotect(c.objects, self.clock.now())
        self._changed()
        self._start_ops()
        self.on_change()
        return freed

    def touch(self, manifest: Manifest) -> None:
        self.tier.touch(list(manifest.objects))

    # ---- ordinary (demand) reads: no reservation, no budget --------------------------------
    def ordinary_read(self, claim_id: str, manifest: Manifest, on_done: Callable[[], None]) -> None:
        objects = _unique(manifest.objects)
        read = _Read(objects, set(), on_done)
        resident = [o for o in objects if self.tier.is_resident(o.object_id)]
        self.tier.pin(resident)
        self.tier.touch(resident)
        read.pinned.extend(resident)
        to_read = []
        for obj in objects:
            if self.tier.is_resident(obj.object_id):
                continue
            op_id = self._object_op.get(obj.object_id)
            if op_id is None or not self._ops[op_id].running:
                # a queued staging op may wait for room this read's own bytes hold (its
                # request's load stalls the engine that would free it): read it on demand
                to_read.append(obj)
            else:
                read.pending_ops.add(op_id)
        if to_read:
            read.pending_ops.add(self._issue(OpKind.ORDINARY, to_read))
        self._reads[claim_id] = read
        if not read.pending_ops:
            self.clock.call_later(0.0, on_done)
        self._changed()
        self._start_ops()

    def end_ordinary(self, claim_id: str) -> None:
        read = self._reads.pop(claim_id)
        self.tier.unpin(read.pinned)
        self._changed()
        self._start_ops()

    # ---- staging queue ------------------------------------------------------------------
    def _issue(self, kind: OpKind, objects: list[KvObject]) -> int:
        op = _Op(self._next_op, kind, objects, sum(o.size_bytes for o in objects))
        self._next_op += 1
        self._ops[op.op_id] = op
        for obj in objects:
            self._object_op[obj.object_id] = op.op_id
        return op.op_id

    def _start_ops(self) -> None:
        """Issue queued staging ops in order while slots and room allow (one that does not
        fit waits: head of line). Ordinary reads are the demand path, not staging: they go
        to the device at once, contending with staging, and stream through if no room."""
        running = sum(op.running for op in self._ops.values() if op.kind is OpKind.STAGE)
        blocked = False
        for op in self._ops.values():
            if op.running:
                continue
            if op.kind is OpKind.STAGE:
                if blocked or running >= self.concurrency:
                    continue
                if not self.tier.make_room(op.size_bytes):
                    blocked = True
                    continue
                running += 1
            elif not self.tier.make_room(op.size_bytes):
                op.bypass = True
            if not op.bypass:
                self.tier.inflight_bytes += op.size_bytes
            op.running = True
            self._changed()  # room was made: residency may have changed
            self._advance_share()
            self._running += 1
            op.start_s, op.share_at_start_s = self.clock.now(), self._share_s
            self.read_bytes_total += op.size_bytes
            self.device.start(op.op_id, op.size_bytes, self._op_done)

    def _retire(self, op_id: int, landed: bool) -> _Op:
        """Out of the queue: its in-flight bytes and device share end; with `landed` (the
        device read it) its objects become resident, unless it streamed through."""
        op = self._ops.pop(op_id)
        if op.running and not op.bypass:
            self.tier.inflight_bytes -= op.size_bytes
        for obj in op.objects:
            if self._object_op.get(obj.object_id) == op_id:  # a staging op may read it anew
                del self._object_op[obj.object_id]
            if landed and not op.bypass:
                self.tier.insert(obj)
        if op.running:
            self._advance_share()
            self._running -= 1
        return op

    def _op_done(self, op_id: int) -> None:
        op = self._retire(op_id, landed=True)
        now_s = self.clock.now()
        self.rate.observe_op(op.size_bytes, self._share_s - op.share_at_start_s, now_s - op.start_s)
        self._changed()
        ready = [cid for cid, c in self._commitments.items() if op_id in c.pending_ops]
        done_reads = self._settle_reads(op)
        for cid in ready:
            c = self._commitments[cid]
            c.pending_ops.discard(op_id)
            if not c.pending_ops:
                if c.cancel_pending:
                    self.release(cid)
                else:
                    self.on_ready(cid)
        self._start_ops()
        for fn in done_reads:
            fn()
        self.on_change()

    def _settle_reads(self, op: _Op) -> list[Callable[[], None]]:
        done = []
        in_op = {o.object_id for o in op.objects}
        for read in self._reads.values():
            if op.op_id not in read.pending_ops:
                continue
            read.pending_ops.discard(op.op_id)
            mine = [
                o
                for o in read.objects
                if o.object_id in in_op and self.tier.is_resident(o.object_id)
            ]
            self.tier.pin(mine)
            read.pinned.extend(mine)
            if not read.pending_ops:
                done.append(read.on_done)
        return done

    def _changed(self) -> None:
        self.version += 1

    def _advance_share(self) -> None:
        now_s = self.clock.now()
        if self._running:
            self._share_s += (now_s - self._share_at_s) / self._running
        self._share_at_s = now_s

    # ---- what the runtime adapter may ask ----------------------------------------------
    def pending_eta_s(self, claim_id: str) -> float:
        """Projected time until this claim's committed staging (or its ordinary read)
        completes, on the same queue projection as TTR; 0 when nothing is pending."""
        c = self._commitments.get(claim_id)
        read = self._reads.get(claim_id)
        pending = c.pending_ops if c is not None else read.pending_ops if read else set()
        if not pending:
            return 0.0
        key = (self.version, self.clock.now())
        if self._eta_cache is None or self._eta_cache[0] != key:
            query = self.ttr_query(Manifest(()))
            finish_s = project_finish_s(query.ops, self.concurrency, self.rate.aggregate_bytes_s)
            self._eta_cache = (key, dict(zip(self._ops, finish_s, strict=True)))
        by_op = self._eta_cache[1]
        return max((by_op[op_id] for op_id in pending if op_id in by_op), default=0.0)

    # ---- ops a device performs outside the provider (the live stack's stock reads) -----
    def op_kind(self, op_id: int) -> OpKind:
        return self._ops[op_id].kind

    def op_objects(self, op_id: int) -> list[KvObject]:
        return list(self._ops[op_id].objects)

    def op_bytes(self, op_id: int) -> int:
        return self._ops[op_id].size_bytes

    def issued_by(self, fn: Callable[[], None]) -> tuple[int, ...]:
        """Run `fn` (an ``ordinary_read`` or a commit); the ops it issued, in order."""
        first = self._next_op
        fn()
        return tuple(range(first, self._next_op))

    def read_pending(self, read_id: str) -> set[int]:
        """The ops this ordinary read still waits on (its own and those it joined)."""
        read = self._reads.get(read_id)
        return set(read.pending_ops) if read is not None else set()

    def waiters(self, op_id: int) -> tuple[int, int]:
        """(commitments, ordinary reads) still waiting on this op."""
        return (
            sum(op_id in c.pending_ops for c in self._commitments.values()),
            sum(op_id in r.pending_ops for r in self._reads.values()),
        )

    def drop_op(self, op_id: int) -> None:
        """Remove an op nobody waits on whose read never completed: out of the queue view,
        nothing made resident, no rate sample (it was not timed to its end)."""
        commitments, reads = self.waiters(op_id)
        if commitments or reads:
            raise RuntimeError(f"op {op_id}: {commitments} commitments, {reads} reads wait on it")
        self._retire(op_id, landed=False)
        self._changed()
        self._start_ops()
        self.on_change()

    def queue_bytes(self) -> int:
        """Bytes of every op outstanding (issued, not seen complete)."""
        return sum(op.size_bytes for op in self._ops.values())

    # ---- what the evidence reads --------------------------------------------------------
    @property
    def meter(self) -> ByteTimeMeter:
        return self.tier.meter

    def outstanding(self) -> int:
        return len(self._commitments)
