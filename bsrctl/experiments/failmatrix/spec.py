"""The `bsrctl failmatrix` spec: a workload x fault matrix, each cell with its expected outcome.

Layout::

    stack: {...}                 # bsrctl.specs.StackSpec
    restore: {...}               # bsrkv.settings.RestoreTuning (timeouts, checksum)
    workload:
      window_chunks: 4           # W of the serving cells (> 0: BSR on)
      admission_budget_chunks: 4 # B; 0 means B = W
      prompt_tokens: 4000        # prefix seeded then restored (one fresh prompt per cell)
      max_tokens: 8
      salt: fm-cpu
    storage:                     # cells with `stack: storage` (in-process, TP ranks, no model;
      tp_ranks: 2                #   chunks of stack.lmcache.chunk_size tokens, as served)
      prefix_tokens: 4096
      window_chunks: 2           # W of the storage cells
      l1_capacity_bytes: 8388608
    cells:
      - id: window-timeout
        fault: window_timeout    # see FAULTS
        at: during_window        # before_request | during_window | between_windows
        window: 1                # k
        source: fs               # the tier that serves the restore when nothing fails
        expect: recompute        # lower_tier | recompute | closed
        bound_s: 120

Expected outcomes: ``lower_tier`` = the full prefix from the next valid tier; ``recompute`` =
0 cached tokens and local recomputation; ``closed`` = either of the two (which one depends on
timing, e.g. L1 pressure), never a partial count, or an explicit error (never a hang).
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, model_validator

from bsrctl.errors import BadInput
from bsrctl.spec_io import UNION_TAGS, Strict, describe_error, read_yaml
from bsrctl.specs import StackSpec, resolve_registration
from bsrkv.settings import RestoreSettings, RestoreTuning

Point_ = Literal["before_request", "during_window", "between_windows", "during_store"]
Expect = Literal["lower_tier", "recompute", "closed", "restored"]

# fault -> (stack it runs on, injection points it supports)
FAULTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mooncake_master_down": ("serving", ("before_request", "between_windows")),
    "mooncake_and_fs_absent": ("serving", ("before_request",)),
    "window_timeout": ("serving", ("during_window",)),
    "object_corrupted": ("serving", ("during_window",)),
    "object_truncated": ("serving", ("during_window",)),
    "l1_exhausted": ("serving", ("between_windows",)),
    "lmcache_killed": ("serving", ("between_windows",)),
    "storage_node_partitioned": ("serving", ("between_windows",)),
    # two hosts: the storage node's namespace destroyed mid-restore (LMCache #1814)
    "storage_node_lost": ("serving", ("between_windows",)),
    # every load of the source tier fails while armed (vLLM #55297, #49250)
    "load_fails_always": ("serving", ("during_window",)),
    # every load from window k on held past the window timeout (a slow tier)
    "slow_tier": ("serving", ("during_window",)),
    "rank_keys_dropped": ("storage", ("during_window",)),
    "storage_window_timeout": ("storage", ("during_window",)),
    # the FS L2 on a size-capped tmpfs: the kernel's ENOSPC (failmatrix.store_faults)
    "store_failed_midway": ("storage", ("during_store",)),  # LMCache #4991
    "disk_full": ("storage", ("during_store",)),  # the disk fills while stores are written
    # the master restarted (metadata gone, the node left running): Mooncake #1336, #1871, #2254
    "mooncake_master_restarted": ("serving", ("before_request",)),
    # W = 0 (LMCache's whole-plan retrieve) of a prefix larger than L1: LMCache #4759
    "whole_plan_past_l1": ("serving", ("before_request",)),
    # no fault: `requests` restores of mixed sizes at once under B (vLLM #31210, #45704)
    "concurrent_restores": ("serving", ("before_request",)),
}
STORE_FAULTS = ("store_failed_midway", "disk_full")

# fault -> the public reports it covers (GitHub issues of those projects), for the report
FIELD_REPORTS: dict[str, str] = {
    "store_failed_midway": "LMCache #4991",
    "disk_full": "LMCache #4991 (ENOSPC)",
    "whole_plan_past_l1": "LMCache #4759",
    "storage_node_partitioned": "a partition to the storage node",
    "storage_node_lost": "LMCache #1814",
    "mooncake_master_restarted": "Mooncake #1336, #1871, #2254",
    "load_fails_always": "vLLM #55297, #49250",
    "concurrent_restores": "vLLM #31210, #45704",
    "slow_tier": "L2 latency spikes",
}


class WorkloadSpec(Strict):
    prompt_tokens: int = Field(4000, gt=0, description="prefix tokens per cell's prompt")
    max_tokens: int = Field(8, gt=0)
    salt: str = Field("bsrctl-failmatrix", min_length=1)
    window_chunks: int = Field(gt=0, description="W of the serving cells")
    admission_budget_chunks: int = Field(0, ge=0, description="B; 0 means B = W")
    flood_requests: int = Field(
        8, ge=1, description="l1_exhausted: other prompts warm-prefetched into L1"
    )
    flood_prompt_tokens: int = Field(
        1024,
        gt=0,
        description="l1_exhausted: tokens of each other prompt (small batches, so L1 fills "
        "to the last block: LMCache allocates a prefetch's chunks all or nothing)",
    )


class StorageCellsSpec(Strict):
    """Geometry of the cells that run on the in-process storage stack."""

    registration: str | dict[str, Any] = Field(
        "tiny-llama",
        description="the geometry stored and restored, as a spec's `registration:` (a "
        "preset, a registration YAML file or one inline); chunks of stack.lmcache.chunk_size",
    )
    tp_ranks: int = Field(2, ge=1)
    prefix_tokens: int = Field(4096, gt=0)
    window_chunks: int = Field(2, gt=0)
    l1_capacity_bytes: int = Field(8 << 20, ge=4096)


class CellSpec(Strict):
    """What every cell has; its kind (the subclasses, read by ``fault``: ``Cell``) narrows
    ``fault`` and checks the cell against the spec."""

    KIND: ClassVar[str] = "unknown fault"  # its union tag: read only for a fault no kind has
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", description="unique cell name")
    fault: Literal[tuple(FAULTS)]  # type: ignore[valid-type]
    at: Point_ = "during_window"
    window: int = Field(1, ge=0, description="k: the window the fault strikes or holds")
    source: Literal["fs", "mooncake", "all"] = Field(
        "fs", description="the tier that holds the prefix (the others are hidden); all: both"
    )
    expect: Expect
    rank: int = Field(1, ge=0, description="rank_keys_dropped: the rank whose key goes")
    hold_s: float = Field(4.0, gt=0, description="between_windows: how long window k is held")
    bound_s: float = Field(180.0, gt=0, description="the cell must end within this")
    adapter: Literal["bsr_fs", "stock"] = Field(
        "bsr_fs", description="store faults: the FS L2 adapter under test (stock: LMCache's own)"
    )
    delay_s: float = Field(
        0.0,
        ge=0,
        description="slow_tier: how long each load from window k on is held (0: 1.5 x "
        "restore.window_timeout_s, past the window's timeout)",
    )
    chunk: int = Field(2, ge=0, description="store_failed_midway: the chunk whose store fails")
    prompt_tokens: int | None = Field(
        None, gt=0, description="this cell's prefix tokens (None: workload.prompt_tokens)"
    )
    requests: int = Field(16, ge=2, description="concurrent_restores: requests sent at once")
    mix_tokens: list[Annotated[int, Field(gt=0)]] = Field(
        [1024, 2048, 3072, 4000],
        min_length=1,
        description="concurrent_restores: the prefix sizes, cycled over the requests",
    )
    aux_bytes: int = Field(
        0, ge=0, description="concurrent_restores, whole_plan_past_l1: the pool bound's aux"
    )
    fail_after_bytes: int = Field(
        65536,
        ge=0,
        multiple_of=4096,
        description="store_failed_midway: bytes the failing store writes before ENOSPC "
        "(the tmpfs's free space then; a multiple of its 4 KiB page)",
    )

    @property
    def stack(self) -> str:
        return FAULTS[self.fault][0]

    def tokens(self, default: int) -> int:
        """This cell's prefix tokens (`default`: the workload's)."""
        return self.prompt_tokens or default

    def mix(self) -> list[int]:
        """concurrent_restores: each request's prefix tokens, in send order."""
        return [self.mix_tokens[i % len(self.mix_tokens)] for i in range(self.requests)]

    def check(self, spec: FailMatrixSpec) -> None:
        """Raise ValueError naming the field and the fix when the cell cannot run in ``spec``."""
        where = f"cell {self.id!r}"
        points = FAULTS[self.fault][1]
        if self.at not in points:
            raise ValueError(
                f"{where}: fault {self.fault} is injected at {list(points)}, not {self.at!r}"
            )
        if self.expect == "restored" and self.fault != "concurrent_restores":
            raise ValueError(f"{where}: expect restored is concurrent_restores' outcome (no fault)")
        self._check(spec, where)

    def _check(self, spec: FailMatrixSpec, where: str) -> None:
        raise NotImplementedError(type(self).__name__)


def _faults(kind: str) -> tuple[str, ...]:
    return tuple(f for f, (stack, _) in FAULTS.items() if stack == kind)


SCENARIO_FAULTS = ("mooncake_master_restarted", "whole_plan_past_l1", "concurrent_restores")
WINDOW_FAULTS = tuple(f for f in _faults("serving") if f not in SCENARIO_FAULTS)
STORAGE_FAULTS = tuple(f for f in _faults("storage") if f not in STORE_FAULTS)


class ServingCell(CellSpec):
    """A fault struck at one window of one served request's restore."""

    KIND: ClassVar[str] = "serving cell"
    fault: Literal[WINDOW_FAULTS]  # type: ignore[valid-type]

    def _check(self, spec: FailMatrixSpec, where: str) -> None:
        _check_serving_cell(spec, self, where)


class StorageCell(CellSpec):
    """A fault on the in-process storage stack (TP ranks, no model)."""

    KIND: ClassVar[str] = "storage cell"
    fault: Literal[STORAGE_FAULTS]  # type: ignore[valid-type]

    def _check(self, spec: FailMatrixSpec, where: str) -> None:
        n = spec.storage_windows()
        if self.rank >= spec.storage.tp_ranks:
            raise ValueError(
                f"{where}: rank {self.rank} >= storage.tp_ranks {spec.storage.tp_ranks}"
            )
        if self.window >= n:
            raise ValueError(f"{where}: window {self.window} >= {n} windows of the storage prefix")


class StoreFaultCell(CellSpec):
    """A store that fails (the FS L2 on a size-capped tmpfs)."""

    KIND: ClassVar[str] = "store fault cell"
    fault: Literal[STORE_FAULTS]  # type: ignore[valid-type]

    def _check(self, spec: FailMatrixSpec, where: str) -> None:
        _check_store_cell(spec, self, where)


class ScenarioCell(CellSpec):
    """A cell of more than one request (``failmatrix.scenarios``)."""

    KIND: ClassVar[str] = "scenario cell"
    fault: Literal[SCENARIO_FAULTS]  # type: ignore[valid-type]

    def _check(self, spec: FailMatrixSpec, where: str) -> None:
        _check_scenario_cell(spec, self, where)


CELL_KINDS: tuple[type[CellSpec], ...] = (ServingCell, StorageCell, StoreFaultCell, ScenarioCell)
_KIND_OF = {
    f: k.KIND for k in CELL_KINDS for f in typing.get_args(k.model_fields["fault"].annotation)
}
assert set(_KIND_OF) == set(FAULTS), "every fault is of exactly one cell kind"
UNION_TAGS.update(k.KIND for k in (CellSpec, *CELL_KINDS))


def _cell_kind(raw: Any) -> str:
    """The kind a cell's ``fault`` names; an unknown fault is read by the base model, whose
    error names ``fault`` and lists the faults there are."""
    fault = raw.get("fault") if isinstance(raw, dict) else getattr(raw, "fault", None)
    return _KIND_OF.get(fault, CellSpec.KIND) if isinstance(fault, str) else CellSpec.KIND


# A cell of the matrix: its kind read from its fault.
Cell = Annotated[
    Annotated[CellSpec, Tag(CellSpec.KIND)]
    | Annotated[ServingCell, Tag(ServingCell.KIND)]
    | Annotated[StorageCell, Tag(StorageCell.KIND)]
    | Annotated[StoreFaultCell, Tag(StoreFaultCell.KIND)]
    | Annotated[ScenarioCell, Tag(ScenarioCell.KIND)],
    Discriminator(_cell_kind),
]


class FailMatrixSpec(Strict):
    stack: StackSpec = StackSpec()
    restore: RestoreTuning = RestoreTuning()
    workload: WorkloadSpec
    storage: StorageCellsSpec = StorageCellsSpec()
    cells: list[Cell] = Field(min_length=1)

    @model_validator(mode="after")
    def _coherent(self) -> FailMatrixSpec:
        ids = [c.id for c in self.cells]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"cell ids must be unique; repeated: {dup}")
        for c in self.cells:
            c.check(self)
        return self

    def settings(self) -> RestoreSettings:
        """The serving deployment's restore settings: the tuning with the workload's W, B."""
        wl = self.workload
        return RestoreSettings.of(self.restore, wl.window_chunks, wl.admission_budget_chunks)

    def serving_windows(self, tokens: int | None = None) -> int:
        chunks = (tokens or self.workload.prompt_tokens) // self.stack.lmcache.chunk_size
        return math.ceil(chunks / self.workload.window_chunks)

    def bytes_per_chunk(self) -> int:
        """c: one chunk's bytes on a rank of the served model (its derived registration)."""
        st = self.stack
        tp = st.vllm.tensor_parallel_size
        return resolve_registration(
            "auto", st, tp, st.lmcache.chunk_size, "stack.vllm"
        ).bytes_per_chunk

    def storage_windows(self) -> int:
        """Windows of the storage cells' prefix, in chunks of ``stack.lmcache.chunk_size``."""
        s = self.storage
        chunks = math.ceil(s.prefix_tokens / self.stack.lmcache.chunk_size)
        return math.ceil(chunks / s.window_chunks)


def _check_serving_cell(spec: FailMatrixSpec, c: CellSpec, where: str) -> None:
    lm, v, r = spec.stack.lmcache, spec.stack.vllm, spec.restore
    n = spec.serving_windows()
    last = n - 1 if c.at == "during_window" else n - 2
    if c.window > last:
        raise ValueError(
            f"{where}: window {c.window} out of range for {c.at} ({n} windows of "
            f"{spec.workload.window_chunks} chunks in {spec.workload.prompt_tokens} tokens); "
            f"use 0..{last}"
        )
    if spec.workload.prompt_tokens + spec.workload.max_tokens > v.max_model_len:
        raise ValueError("workload.prompt_tokens + max_tokens exceeds stack.vllm.max_model_len")
    needs_moon = c.source in ("mooncake", "all") or c.fault.startswith("mooncake")
    if spec.stack.kind == "attach":  # the deployment decides; a cell it cannot run is UNKNOWN
        return
    if needs_moon and not spec.stack.mooncake.enabled:
        raise ValueError(f"{where}: needs stack.mooncake.enabled: true")
    if c.fault in ("storage_node_partitioned", "storage_node_lost") and (
        spec.stack.mooncake.topology != "two-hosts" or c.source != "mooncake"
    ):
        raise ValueError(
            f"{where}: needs stack.mooncake.topology: two-hosts and source mooncake (the "
            "storage node is cut off or lost while the restore reads it)"
        )
    if (
        c.source in ("fs", "all")
        and not lm.fs_l2
        or c.fault.startswith("object_")
        and c.source != "fs"
    ):
        raise ValueError(f"{where}: needs source fs and stack.lmcache.fs_l2: true")
    if c.fault in ("object_corrupted", "object_truncated") and not r.checksum:
        raise ValueError(f"{where}: needs restore.checksum: true (detect before install)")
    if c.at == "between_windows" and c.hold_s >= r.window_timeout_s:
        raise ValueError(
            f"{where}: hold_s {c.hold_s} must be below restore.window_timeout_s "
            f"{r.window_timeout_s} (a hold longer than the timeout is the window_timeout fault)"
        )
    if c.expect == "lower_tier" and (c.fault != "mooncake_master_down" or c.source != "all"):
        raise ValueError(
            f"{where}: expect lower_tier needs fault mooncake_master_down with source all "
            "(the FS L2 below Mooncake holds the full prefix)"
        )
    if c.at == "between_windows" and c.source == "all":
        raise ValueError(f"{where}: between_windows holds one tier's window: source fs or mooncake")
    if c.fault in ("load_fails_always", "slow_tier") and (
        c.source == "all" or c.expect != "recompute"
    ):
        raise ValueError(
            f"{where}: fault {c.fault} breaks one tier: source fs or mooncake, expect recompute"
        )
    if c.fault == "slow_tier" and 0 < c.delay_s <= r.window_timeout_s:
        raise ValueError(
            f"{where}: delay_s {c.delay_s} must exceed restore.window_timeout_s "
            f"{r.window_timeout_s} (or be 0: 1.5 x the timeout)"
        )


def _check_scenario_cell(spec: FailMatrixSpec, c: CellSpec, where: str) -> None:
    """The cells of more than one request (``failmatrix.scenarios``)."""
    v, lm = spec.stack.vllm, spec.stack.lmcache
    sizes = c.mix() if c.fault == "concurrent_restores" else [c.tokens(spec.workload.prompt_tokens)]
    over = [n for n in sizes if n + spec.workload.max_tokens > v.max_model_len]
    if over:
        field = "mix_tokens" if c.fault == "concurrent_restores" else "prompt_tokens"
        raise ValueError(
            f"{where}: {field} {over[0]} + workload.max_tokens exceeds stack.vllm.max_model_len "
            f"{v.max_model_len}"
        )
    want = {
        "mooncake_master_restarted": ("mooncake", "recompute"),
        "whole_plan_past_l1": ("fs", "closed"),
        "concurrent_restores": ("fs", "restored"),
    }[c.fault]
    if (c.source, c.expect) != want:
        raise ValueError(f"{where}: fault {c.fault} needs source {want[0]} and expect {want[1]}")
    if spec.stack.kind == "attach":
        return
    if c.source == "fs" and not lm.fs_l2:
        raise ValueError(f"{where}: needs stack.lmcache.fs_l2: true")
    if c.source == "mooncake" and not spec.stack.mooncake.enabled:
        raise ValueError(f"{where}: needs stack.mooncake.enabled: true")
    if c.fault == "whole_plan_past_l1":
        chunks = sizes[0] // lm.chunk_size
        need = chunks * spec.bytes_per_chunk()
        if need <= lm.l1_size_bytes:
            raise ValueError(
                f"{where}: prompt_tokens {sizes[0]} is {chunks} chunks = {need} B, within "
                f"stack.lmcache.l1_size_bytes {lm.l1_size_bytes}: give a prefix larger than L1"
            )
    if c.fault == "concurrent_restores" and c.requests > v.max_num_seqs:
        raise ValueError(
            f"{where}: requests {c.requests} > stack.vllm.max_num_seqs {v.max_num_seqs}: "
            "vLLM would queue the rest, so they would not restore at once"
        )


def _check_store_cell(spec: FailMatrixSpec, c: CellSpec, where: str) -> None:
    """A store fault: the request for the prefix whose store failed recomputes what the
    tier lacks; the failing chunk lies inside the storage prefix and its first object is
    bigger than what the failing store may write."""
    if c.expect != "recompute":
        raise ValueError(f"{where}: fault {c.fault} expects recompute (the unstored part)")
    chunks = math.ceil(spec.storage.prefix_tokens / spec.stack.lmcache.chunk_size)
    if c.fault == "store_failed_midway" and c.chunk >= chunks:
        raise ValueError(f"{where}: chunk {c.chunk} >= {chunks} chunks of the storage prefix")


def load_matrix(path: Path) -> tuple[FailMatrixSpec, dict]:
    raw = read_yaml(path)
    try:
        return FailMatrixSpec.model_validate(raw), raw
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe_error(FailMatrixSpec, exc)}") from None
