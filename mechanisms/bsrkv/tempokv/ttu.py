"""Time-to-use: a read-only projection of the engine until the target's retrieval begins.

Running and queued requests advance on one shared timeline under the engine's slot limit,
FCFS order and chunked-prefill token budget (a pass grants slots only while budget
remains), with calibrated step costs; remaining output comes from recent completions.
With synchronous loads a step waits for the loads it carries; with queued loads (vLLM's
asynchronous connector loads) a pass with a free slot starts every waiting load that fits
the GPU KV. The target's own KV is assumed stage-ready."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

# Load completions this close are one instant: the engine's clock lands them together, while
# a projection derives them by subtraction (floating-point noise of ~1e-11 s).
SAME_S = 1e-9


@dataclass(frozen=True, slots=True)
class CostModel:
    """One engine step: step_s = base + dense work per token + attention pairs + KV reads."""

    step_base_s: float  # per step: weight reads, scheduling, sampling
    token_s: float  # dense compute per token processed in the step (prefill or decode)
    attn_pair_s: float  # prefill attention per (query token, context token) pair
    decode_ctx_token_s: float  # KV read per context token of one decoding sequence

    def step_s(self, tokens: int, attn_pairs: int, decode_ctx_tokens: int) -> float:
        return (
            self.step_base_s
            + self.token_s * tokens
            + self.attn_pair_s * attn_pairs
            + self.decode_ctx_token_s * decode_ctx_tokens
        )


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_seqs: int = 4  # active sequences (vLLM max_num_seqs)
    max_batched_tokens: int = 8192  # chunked-prefill token budget per step
    sync_loads: bool = True  # a step waits for the KV loads it carries (else they overlap)
    release_at_first_step: bool = True  # protection ends with the first step computing
    # over the restored KV (else when its transfer ends); no effect on TTU
    queued_loads: bool = False  # vLLM's async connector loads (WAITING_FOR_REMOTE_KVS): a
    # loading request waits outside the running set, holding no slot, and is admitted by a
    # later pass; a pass starts loads for waiting requests while a slot is free
    gpu_kv_tokens: int = 0  # queued loads: GPU KV capacity in tokens (0: unbounded)

    def __post_init__(self) -> None:
        if self.queued_loads and self.sync_loads:
            raise ValueError("queued loads are asynchronous: set sync_loads=False")


def prefill_pairs(chunk_tokens: int, ctx_before: int) -> int:
    """Causal attention pairs of a prefill chunk appended after ctx_before tokens."""
    return chunk_tokens * ctx_before + chunk_tokens * (chunk_tokens + 1) // 2


def budget_left(prefill_left: list[int], limits: EngineLimits) -> int:
    """Token budget a scheduling pass has left for new requests once the running ones took
    theirs (one token per decode, prefill chunks in order): vLLM admits waiting requests
    only while budget remains."""
    budget = limits.max_batched_tokens - sum(1 for n in prefill_left if n == 0)
    for n in prefill_left:
        if n and budget > 0:
            budget -= min(n, budget)
    return budget


@dataclass(frozen=True, slots=True)
class RunningSeq:
    prefill_left_tokens: int  # prompt tokens not yet prefilled
    ctx_tokens: int  # tokens whose KV is on the GPU now
    generated_tokens: int  # output tokens produced so far
    ready_in_s: float = 0.0  # holds a slot but joins the batch only after its KV load ends


@dataclass(frozen=True, slots=True)
class QueuedSeq:
    req_id: str
    prompt_tokens: int
    cached_tokens: int  # restored from the external cache instead of prefilled
    load_s: float  # its fast-tier→GPU retrieval, assuming its KV is stage-ready
    stage_ready_in_s: float = 0.0  # known retrieval dependency: committed staging still
    # running finishes this long after the snapshot (0: ready, or nothing known)


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    at_s: float  # when it was taken
    busy_s: float  # engine time already committed (a step or load in progress)
    running: tuple[RunningSeq, ...]
    waiting: tuple[QueuedSeq, ...]  # FCFS order
    holding: tuple[RunningSeq, ...] = ()  # queued loads: retrieval begun, not yet admitted


class OutputPredictor:
    """Remaining output for a sequence with n tokens: mean of N − n over recent completed
    lengths N > n; the generation limit bounds it (and stands in when nothing qualifies)."""

    def __init__(self, limit_tokens: int, prior_tokens: tuple[int, ...] = (), window: int = 64):
        self.limit_tokens = limit_tokens
        self._recent: deque[int] = deque((min(n, limit_tokens) for n in prior_tokens), window)
        self._rebuild()

    def observe(self, output_tokens: int) -> None:
        self._recent.append(min(output_tokens, self.limit_tokens))
        self._rebuild()

    def _rebuild(self) -> None:
        self._sorted = sorted(self._recent)
        self._suffix = [0] * (len(self._sorted) + 1)
        for i in range(len(self._sorted) - 1, -1, -1):
            self._suffix[i] = self._suffix[i + 1] + self._sorted[i]

    def remaining_tokens(self, generated: int) -> float:
        if generated >= self.limit_tokens:
            return 0.0  # at the limit: it ends with the step that produced this token
        i = bisect.bisect_right(self._sorted, generated)
        count = len(self._sorted) - i
        if count == 0:
            return float(max(1, self.limit_tokens - generated))
        mean_left = self._suffix[i] / count - generated
        return min(mean_left, float(self.limit_tokens - generated))

    def remaining_quantile(self, generated: int, u: float) -> float:
        """The u-quantile (0 ≤ u < 1) of N − n over the same recent completions N > n: a draw
        from the empirical distribution of remaining output, early EOS included. Where the
        mean has nothing to condition on, neither has this (the same stand-ins)."""
        if generated >= self.limit_tokens:
            return 0.0
        i = bisect.bisect_right(self._sorted, generated)
        count = len(self._sorted) - i
        if count == 0:
            return float(max(1, self.limit_tokens - generated))
        return float(self._sorted[i + min(count - 1, int(u * count))] - generated)

    def completions_above(self, generated: int) -> tuple[list[int], int, int]:
        """The recent completed lengths N > generated: (sorted lengths, first index, count),
        so a caller can draw many quantiles of N − n with one conditioning."""
        i = bisect.bisect_right(self._sorted, generated)
        return self._sorted, i, len(self._sorted) - i


class _Proj:
    __slots__ = ("prefill_left", "ctx", "left", "ready_s")

    def __init__(self, prefill_left: int, ctx: int, left: float, ready_s: float = 0.0) -> None:
        self.prefill_left = prefill_left
        self.ctx = ctx
        self.left = left  # output tokens still to produce (the first comes from prefill)
        self.ready_s = ready_s  # joins the batch once its KV load ends


def project_ttus(
    snap: EngineSnapshot,
    cost: CostModel,
    limits: EngineLimits,
    predictor: OutputPredictor,
    targets: Collection[str] | None = None,
) -> dict[str, float]:
    """TTU (seconds after snap.at_s) of every waiting request: the scheduling pass that grants
    it a slot, which starts its retrieval. Passes run at step boundaries, the first after any
    step in progress. Predecessors hold their slot through their own retrieval, which waits
    for their known staging dependencies; the target's own KV is assumed stage-ready.
    With `targets`, the projection stops once each of them has its TTU (FCFS: later waiting
    requests never move an earlier one's)."""
    full_output = predictor.remaining_tokens(0)
    return project_with_outputs(
        snap,
        [predictor.remaining_tokens(r.generated_tokens) for r in snap.running],
        [full_output] * len(snap.holding),
        [full_output] * len(snap.waiting),
        cost,
        limits,
        targets,
    )


def project_with_outputs(
    snap: EngineSnapshot,
    running_left: Sequence[float],
    holding_output: Sequence[float],
    waiting_output: Sequence[float],
    cost: CostModel,
    limits: EngineLimits,
    targets: Collection[str] | None = None,
) -> dict[str, float]:
    """`project_ttus` with the output lengths given: tokens still to produce for each running
    sequence (snapshot order), and the whole output of each holding and waiting request."""
    seqs = [
        _Proj(
            r.prefill_left_tokens,
            r.ctx_tokens,
            left,
            r.ready_in_s if r.ready_in_s > 0 else -math.inf,  # in the batch, even mid-step
        )
        for r, left in zip(snap.running, running_left, strict=True)
    ]
    # A sequence whose last token comes from the decode step in progress leaves at its end,
    # before the first pass (snapshots count that step as done).
    seqs = [s for s in seqs if s.left > 0]
    wanted = waiting_reach(snap.waiting, targets)
    if limits.queued_loads:
        return _project_queued(snap, seqs, holding_output, waiting_output, cost, limits, wanted)
    ttus: dict[str, float] = {}
    t_s = snap.busy_s
    loads_pending = any(s.ready_s > 0 for s in seqs)  # loads hold their slot until done
    if t_s < 0 or (limits.sync_loads and loads_pending):
        # mid prefill step, or a step waiting for its loads: the next pass follows that step
        t_s = _advance(seqs, t_s, cost, limits, until_exit=False)
    waiting = snap.waiting
    i = 0
    while i < wanted:
        budget = budget_left([s.prefill_left for s in seqs if s.ready_s <= t_s + SAME_S], limits)
        while len(seqs) < limits.max_seqs and i < wanted and budget > 0:
            q = waiting[i]
            ttus[q.req_id] = t_s
            prefill = max(1, q.prompt_tokens - q.cached_tokens)
            budget -= min(budget, prefill)
            ready_s = max(t_s, q.stage_ready_in_s) + q.load_s
            seqs.append(_Proj(prefill, q.cached_tokens, waiting_output[i], ready_s))
            i += 1
        if i < wanted:
            # a free slot blocked only by the spent budget reopens at the next step boundary
            blocked = len(seqs) < limits.max_seqs and budget <= 0
            t_s = _advance(seqs, t_s, cost, limits, until_exit=not blocked)
    return ttus


def waiting_reach(waiting: Sequence[QueuedSeq], targets: Collection[str] | None) -> int:
    """How many waiting requests the projection must place to reach every target (None:
    all of them)."""
    if targets is None:
        return len(waiting)
    last = 0
    for i, q in enumerate(waiting):
        if q.req_id in targets:
            last = i + 1
    return last


def _project_queued(
    snap: EngineSnapshot,
    seqs: list[_Proj],
    holding_output: Sequence[float],
    waiting_output: Sequence[float],
    cost: CostModel,
    limits: EngineLimits,
    wanted: int,
) -> dict[str, float]:
    """Queued loads: at each pass, loaded requests are admitted in order while slots are
    free; if a slot is still free, every waiting request whose prompt fits the GPU KV starts
    its retrieval then. Between passes the batch steps until a sequence finishes or, with a
    slot free, until a pending load ends."""
    holding = [
        _Proj(h.prefill_left_tokens, h.ctx_tokens, out, h.ready_in_s)
        for h, out in zip(snap.holding, holding_output, strict=True)
    ]
    ttus: dict[str, float] = {}
    t_s = snap.busy_s
    if t_s < 0:  # mid prefill step: the next pass follows it
        t_s = _advance(seqs, t_s, cost, limits, until_exit=False)
    waiting = snap.waiting
    i = 0
    while i < wanted:
        budget = budget_left([s.prefill_left for s in seqs], limits)
        kv_used = sum(p.ctx + p.prefill_left for p in (*seqs, *holding))
        for proj in list(holding):
            if len(seqs) >= limits.max_seqs or budget <= 0:
                break
            if proj.ready_s <= t_s + SAME_S:
                holding.remove(proj)
                proj.ready_s = -math.inf
                seqs.append(proj)
                budget -= min(budget, proj.prefill_left)
        while len(seqs) < limits.max_seqs and i < wanted and budget > 0:
            q = waiting[i]
            if limits.gpu_kv_tokens and kv_used + q.prompt_tokens > limits.gpu_kv_tokens:
                break
            ttus[q.req_id] = t_s
            kv_used += q.prompt_tokens
            ready_s = max(t_s, q.stage_ready_in_s) + q.load_s
            prefill = max(1, q.prompt_tokens - q.cached_tokens)
            holding.append(_Proj(prefill, q.cached_tokens, waiting_output[i], ready_s))
            i += 1
        if i >= wanted:
            break
        free = len(seqs) < limits.max_seqs
        pending = [p.ready_s for p in holding if p.ready_s > t_s + SAME_S]
        if not seqs:
            if not pending:
                break  # nothing runs or loads: the rest cannot start (prompt over capacity)
            t_s = min(pending)
            continue
        cut_s = min(pending) if free and pending else None
        t_s = _advance(seqs, t_s, cost, limits, until_exit=not free, cut_s=cut_s)
    return ttus


def _advance(
    seqs: list[_Proj],
    t_s: float,
    cost: CostModel,
    limits: EngineLimits,
    until_exit: bool,
    cut_s: float | None = None,
) -> float:
    """Step the batch from t_s until at least one sequence finishes (or, with until_exit
    false, for one step or decode stretch; or a decode stretch reaches cut_s); returns
    that time."""
    while True:
        pending = [s.ready_s for s in seqs if s.ready_s > t_s + SAME_S]
        if pending and limits.sync_loads:
            t_s = max(pending)  # the step waits for every load it carries
        active = [s for s in seqs if s.ready_s <= t_s + SAME_S]
        if not active:
            t_s = min(s.ready_s for s in seqs)
            continue
        decoding = [s for s in active if s.prefill_left == 0]
        if len(decoding) < len(active):
            budget = limits.max_batched_tokens - len(decoding)
            tokens, pairs = len(decoding), 0
            for s in active:
                if s.prefill_left and budget > 0:
                    n = min(s.prefill_left, budget)
                    budget -= n
                    tokens += n
                    pairs += prefill_pairs(n, s.ctx)
                    s.prefill_left -= n
                    s.ctx += n
                    if s.prefill_left == 0:
                        s.left -= 1  # the prefill's last step yields the first token
            t_s += cost.step_s(tokens, pairs, sum(s.ctx for s in decoding))
            for s in decoding:
                s.left -= 1
                s.ctx += 1
        else:
            k = max(1.0, min(s.left for s in active))
            step_s = cost.step_s(
                len(active), 0, int(sum(s.ctx for s in active) + len(active) * k / 2)
            )
            joins = [s.ready_s for s in seqs if s.ready_s > t_s + SAME_S]
            if cut_s is not None:
                joins.append(cut_s)
            if joins and t_s + k * step_s > min(joins):
                # a join within SAME_S after a boundary lands at it, as at a pass: its time
                # comes from estimates (a device reports whole bytes left: ~1e-10 s early)
                k = float(max(1, math.ceil((min(joins) - SAME_S - t_s) / step_s)))
            t_s += k * step_s
            for s in active:
                s.left -= k
                s.ctx += int(k)
        done = [s for s in active if s.left <= 1e-9]
        for s in done:
            seqs.remove(s)
        if done or not until_exit or (cut_s is not None and t_s >= cut_s - SAME_S):
            return t_s
