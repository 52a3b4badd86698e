"""TEST ONLY: storage stacks broken on purpose (the matrix can fail): their restore the same
ways as the serving mutant module: ``skip_invalidation`` (destination blocks stay valid),
``partial_after_failure`` (the completed windows are exposed), ``skip_force_local`` (no
marker); and their teardown: ``leak_manager`` (the last rank's StorageManager is left open,
its threads running and its L1 segment mapped; ``close_leaked()`` closes it afterwards).
``run_storage_cell`` / ``run_matrix`` take ``mutant_stack(...)`` as the stack."""

from __future__ import annotations

import dataclasses
from typing import Any

from bsrctl.stack.storage import StorageStack, StorageStackConfig
from bsrkv.restore import BoundedRestorer, RestoreConfig, RestoreStorage

STORAGE_MUTATIONS = ("skip_invalidation", "partial_after_failure", "skip_force_local",
                     "leak_manager")  # fmt: skip
LEAKED: list[Any] = []  # StorageManagers a leak_manager teardown left open


class _KeepValid:
    """A destination whose mark_invalid does nothing (skip_invalidation)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def mark_invalid(self, request_id: str) -> None:
        return None


class MutantRestorer(BoundedRestorer):
    mutations: frozenset[str] = frozenset()

    def _fail(self, run, inflight, destination, kind, detail):  # type: ignore[no-untyped-def]
        if "skip_invalidation" in self.mutations:
            destination = _KeepValid(destination)
        out = super()._fail(run, inflight, destination, kind, detail)
        rid = run.plan.request.request_id
        if "skip_force_local" in self.mutations:
            self.markers.on_teardown(rid)
        if "partial_after_failure" in self.mutations:
            out = dataclasses.replace(
                out, cached_chunks=run.windows_done * self.config.window_chunks
            )
        return out


class MutantStorageStack(StorageStack):
    def __init__(self, config: StorageStackConfig, mutations: frozenset[str]) -> None:
        super().__init__(config)
        self.mutations = mutations

    def make_restorer(
        self, config: RestoreConfig, storage: RestoreStorage | None = None
    ) -> BoundedRestorer:
        base = super().make_restorer(config, storage)
        mutant = MutantRestorer(base.storage, base.config, base.gauge, base.markers)
        mutant.mutations = self.mutations
        return mutant

    def teardown(self, remove_files: bool = False) -> None:
        if "leak_manager" in self.mutations and self.managers:
            rank = max(self.managers)
            LEAKED.append(self.managers.pop(rank))
            self.high_water.pop(rank, None)
        super().teardown(remove_files)


def close_leaked() -> int:
    """Close what leak_manager teardowns left open. Returns how many."""
    n = len(LEAKED)
    while LEAKED:
        LEAKED.pop().close()
    return n


def mutant_stack(*mutations: str):
    """A storage-stack factory whose restorer carries `mutations`."""
    unknown = sorted(set(mutations) - set(STORAGE_MUTATIONS))
    if unknown:
        raise ValueError(f"unknown storage mutation(s) {unknown}; valid: {STORAGE_MUTATIONS}")

    def make(config: StorageStackConfig) -> StorageStack:
        return MutantStorageStack(config, frozenset(mutations))

    return make
