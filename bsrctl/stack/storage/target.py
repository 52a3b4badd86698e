"""The storage target: LMCache's StorageManager in-process (one per rank), real L1 + FS L2,
no model. Runs BSR at paper geometry without an engine.

``StorageTarget.deploy`` is the one way a storage stack is built from a spec: sweep, ladder
and law (through ``measure``), the failure matrix's storage cells and
bench/restore_bandwidth.py all deploy through it (``stack.storage.deploy`` underneath)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bsrctl.errors import BadInput
from bsrctl.specs import TargetSpec
from bsrctl.stack.contracts.measures import StorageMeasures, exact_div
from bsrctl.stack.contracts.target import Prompt
from bsrctl.stack.measure.machine import l1_fits
from bsrctl.trace.collect import COLLECTOR
from bsrkv.registration import Registration
from bsrkv.settings import RestoreSettings

if TYPE_CHECKING:  # LMCache is imported when a stack is deployed, not with the target
    from bsrctl.stack.storage import StorageStack, StorageStackFactory


class StorageTarget:
    """LMCache's StorageManager in-process (one per rank), real L1 + FS L2, no model."""

    kind = "storage"

    def __init__(
        self,
        spec: TargetSpec,
        run_dir: Path,
        *,
        l2_adapter: str = "auto",
        mooncake_master: str = "",
        make_stack: StorageStackFactory | None = None,
    ) -> None:
        """``l2_adapter``: the FS tier's adapter (``StorageStackConfig.l2_adapter``; auto:
        bsrctl's iff load_concurrency > 1). ``mooncake_master`` ("host:port"): the L2 tier
        is that Mooncake store instead (the process runs in its network namespace), not
        files. ``make_stack`` builds the stack from its
        config (default ``stack.storage.deploy``; the failure-matrix tests pass one broken on
        purpose)."""
        self.spec = spec
        self.l2_adapter = "bsr_mooncake" if mooncake_master else l2_adapter
        self.mooncake_master = mooncake_master
        self.make_stack = make_stack
        self.reg: Registration = spec.registration_for("storage")
        self.run_dir = Path(run_dir)
        self.root = Path(spec.storage.root_dir or self.run_dir / "storage")
        self.stack: StorageStack | None = None
        self.settings = RestoreSettings()
        self.traced = False  # holds the span collector (released at teardown)
        self.on_phase: Callable[[str], None] = lambda _step: None  # seed, forget, restore

    @property
    def stored_record(self) -> Path:
        """The registration the L2 files were written with (kept beside them)."""
        return self.root / "registration.json"

    def _stored_geometry(self, wrote: int) -> tuple[str, ...] | None:
        """The geometry recorded when the prefix was stored: this deployment's when it
        wrote the first objects under the root, else the one recorded then."""
        if not self.stored_record.is_file() and wrote:
            assert self.stack is not None
            doc = {"model": self.reg.model, "tensors": list(self.stack.registration.geometry())}
            self.stored_record.write_text(json.dumps(doc, indent=1))
        if not self.stored_record.is_file():
            return None  # files from before records were kept: not known
        return tuple(json.loads(self.stored_record.read_text())["tensors"])

    @property
    def l1_ranks(self) -> int:
        return self.reg.tp_size  # one L1 per rank

    def prepare(self, prompts: list[Prompt]) -> None:
        """Refuse to start when the L2 files of the largest prompt per salt won't fit on disk."""
        per_salt: dict[str, int] = {}
        for salt, n in prompts:
            per_salt[salt] = max(per_salt.get(salt, 0), n)
        need = sum(self.reg.num_chunks(n) for n in per_salt.values())
        need *= self.reg.bytes_per_chunk_all_ranks
        self.root.mkdir(parents=True, exist_ok=True)
        l2 = self.root / "l2"
        have = sum(f.stat().st_size for f in l2.iterdir()) if l2.is_dir() else 0
        free = shutil.disk_usage(self.root).free
        reserve = self.spec.storage.disk_reserve_bytes
        if need - have + reserve > free:
            raise BadInput(
                f"storage.root_dir: L2 files need {need} B ({need / 2**30:.1f} GiB), "
                f"{have} B already there, {free} B free at {self.root} (+ reserve {reserve} B); "
                f"free disk, point root_dir elsewhere or shrink the sizes"
            )

    def fits(self, l1_bytes: int) -> tuple[bool, str]:
        return l1_fits(l1_bytes * self.l1_ranks, self.spec.memory_reserve_bytes)

    def l1_bytes(self, asked: int) -> int:
        """The storage stack builds L1 as asked."""
        return asked

    def deploy(self, l1_bytes: int, settings: RestoreSettings) -> StorageStack:
        """A fresh stack with this L1 per rank and these settings (also ``self.stack``)."""
        from bsrctl.stack.storage import StorageStackConfig, deploy

        self.settings = settings
        if not self.traced:  # the run's timeline.json: every restore's windows, phase by phase
            self.traced = COLLECTOR.acquire(self.spec.stack.trace) is not None
        self.stack = (self.make_stack or deploy)(
            StorageStackConfig(
                root_dir=self.root,
                registration=self.reg,
                l1_capacity_bytes=l1_bytes,
                restore=settings,
                l2_adapter=self.l2_adapter,
                mooncake_master=self.mooncake_master,
                destination=self.spec.storage.destination,
            )
        )
        return self.stack

    def describe(self) -> dict[str, Any]:
        doc = self.stack.describe() if self.stack else {"kind": "storage"}
        return {**doc, "root_dir": str(self.root), "registration": self.reg.to_dict()}

    def store(self, prompts: list[Prompt]) -> None:
        """Nothing to do: measure() seeds the L2 files itself (existing ones are reused)."""

    def measure(
        self, prompt: Prompt, window_chunks: int, cold: bool = True, oracle: bool = True
    ) -> StorageMeasures:
        """One restore of the seeded prefix; ``oracle`` off copies into an anonymous pool
        (``memory``: a KV install's copy) where the spec's destination compares every byte
        while installing, and that pool's bytes are compared after the restore's timer."""
        st, reg = self.stack, self.reg
        assert st is not None, "measure before deploy"
        tokens = prompt.tokens
        self.on_phase("seed")
        seed = st.seed(tokens, prompt.salt)
        stored = self._stored_geometry(seed.objects_written)
        self.on_phase("forget")
        st.forget()
        if self.spec.storage.drop_page_cache:
            st.drop_page_cache()
        budget = self.settings.admission_budget_chunks
        self.on_phase("restore")
        dest = self.spec.storage.destination
        res = st.restore(
            window_chunks,
            budget,
            request_id=f"{prompt.salt}-{tokens}-w{window_chunks}",
            destination=dest if oracle or dest != "verify" else "memory",
        )
        healthy = st.health()
        released = res.l1_usage_after_bytes == res.l1_usage_before_bytes
        chunks = res.cached_tokens // reg.chunk_tokens
        m = res.measures()
        m.update(
            tier="fs",
            l1_bytes_before_restore=max(res.l1_usage_before_bytes.values(), default=0),
            tier_bytes_read=res.bytes_restored,
            bytes_per_chunk_expected=reg.bytes_per_chunk,
            bytes_per_chunk_measured=exact_div(res.bytes_restored, chunks * reg.tp_size),
            registration_digest_expected=reg.digest(),
            registration_tensors_expected=reg.geometry(),
            registration_tensors_live=st.registration.geometry(),
            registration_tensors_stored=stored,
            bytes_per_chunk_allocated=reg.allocated_bytes_per_chunk(res.l1_allocation_unit_bytes),
            rws_bound_bytes=(
                reg.rws_bound_bytes(window_chunks, res.l1_allocation_unit_bytes)
                if window_chunks
                else 0
            ),
            healthy=healthy and released,
            health_detail=(
                f"StorageManagers healthy: {healthy}; L1 back to its start level after the "
                f"restore: {released} ({res.l1_usage_after_bytes} vs {res.l1_usage_before_bytes})"
            ),
            seed_objects_written=seed.objects_written,
            seed_s=round(seed.seed_s, 4),
            restore_s=round(res.restore_s, 6),
            probe_s=round(res.probe_s, 6),
            retrieve_s=round(res.retrieve_s, 6),
        )
        return StorageMeasures(**m)

    def forget_salt_files(self) -> None:
        """Remove every L2 file (bounds disk before seeding a new salt)."""
        if self.stack is not None and self.stack.l2_dir.is_dir():
            for f in self.stack.l2_dir.iterdir():
                f.unlink(missing_ok=True)
        self.stored_record.unlink(missing_ok=True)

    def teardown(self, remove_files: bool = False) -> None:
        """Close the stack; ``remove_files``: also delete its root_dir."""
        if self.stack is not None:
            self.stack.teardown(remove_files=remove_files)
            self.stack = None
        if self.traced:
            COLLECTOR.release()
            self.traced = False

    def cleanup(self) -> None:
        """Remove the L2 files and the mmap destination unless storage.keep_files."""
        self.teardown()
        if not self.spec.storage.keep_files:
            for sub in ("l2", "dest"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
            self.stored_record.unlink(missing_ok=True)
