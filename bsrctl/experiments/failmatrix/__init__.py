"""`bsrctl failmatrix`: a workload x fault matrix proving a failed bounded restore ends
closed, correct and explained, the way Jepsen proves a database.

- ``spec``: the matrix (cells, each with its fault and expected outcome), ``load_matrix``.
- ``injectors``: each fault by real means on the serving stack (arm, strike, recover).
- ``rig``: the serving deployment the serving cells share (seeding, probes, audit).
- ``serving``: one serving cell's run (``ServingRig.run_cell``).
- ``storage``: the cells on the in-process storage stack (two TP ranks, one rank's key).
- ``checks``: the named checks, pure functions over what a cell recorded.
- ``run``: ``run_failmatrix`` / ``run_matrix``; summary.md comes from
  ``bsrctl.report.failmatrix.render`` over the evidence.
"""

from bsrctl.experiments.failmatrix.run import run_failmatrix, run_matrix
from bsrctl.experiments.failmatrix.serving import ServingRig
from bsrctl.experiments.failmatrix.spec import FAULTS, CellSpec, FailMatrixSpec, load_matrix
from bsrctl.experiments.failmatrix.storage import run_storage_cell
from bsrctl.stack.launch.extensions import ServerModule

__all__ = [
    "FAULTS",
    "CellSpec",
    "FailMatrixSpec",
    "ServerModule",
    "ServingRig",
    "load_matrix",
    "run_failmatrix",
    "run_matrix",
    "run_storage_cell",
]
