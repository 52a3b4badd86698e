"""TEST ONLY: storage stacks whose restore is broken on purpose (the matrix can fail), the
same ways as the serving mutant module: ``skip_invalidation`` (destination blocks stay
valid), ``partial_after_failure`` (the completed windows are exposed), ``skip_force_local``
(no marker). ``run_storage_cell`` / ``run_matrix`` take ``mutant_stack(...)`` as the stack."""

from __future__ import annotations

import dataclasses
from typing import Any

from bsrctl.restore import BoundedRestorer, RestoreConfig
from bsrctl.stack.storage import FaultSpec, StorageStack, StorageStackConfig

STORAGE_MUTATIONS = ("skip_invalidation", "partial_after_failure", "skip_force_local")


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
        self, config: RestoreConfig, fault: FaultSpec | None = None
    ) -> BoundedRestorer:
        base = super().make_restorer(config, fault)
        mutant = MutantRestorer(base.storage, base.config, base.gauge, base.markers)
        mutant.mutations = self.mutations
        return mutant


def mutant_stack(*mutations: str):
    """A storage-stack factory whose restorer carries `mutations`."""
    unknown = sorted(set(mutations) - set(STORAGE_MUTATIONS))
    if unknown:
        raise ValueError(f"unknown storage mutation(s) {unknown}; valid: {STORAGE_MUTATIONS}")

    def make(config: StorageStackConfig) -> StorageStack:
        return MutantStorageStack(config, frozenset(mutations))

    return make
