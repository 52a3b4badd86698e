"""The storage cells' deployment, read from the matrix's spec: what both the restore cells
(``failmatrix.storage``) and the store-fault cells (``failmatrix.store_faults``) deploy."""

from __future__ import annotations

from pathlib import Path

from bsrctl.experiments.failmatrix.spec import FailMatrixSpec
from bsrctl.specs import StorageSpec, TargetSpec
from bsrkv.registration import Registration


def target_spec(spec: FailMatrixSpec, root: Path | None = None) -> TargetSpec:
    """The storage cells' deployment as a TargetSpec: the matrix's stack (chunk size),
    restore tuning and ``storage`` geometry; every installed byte verified."""
    s = spec.storage
    return TargetSpec(
        stack=spec.stack,
        restore=spec.restore,
        registration=s.registration,
        storage=StorageSpec(tp_ranks=s.tp_ranks, root_dir=root, destination="verify"),
    )


def storage_registration(spec: FailMatrixSpec) -> Registration:
    """The geometry the storage cells store and restore."""
    return target_spec(spec).registration_for("storage")
