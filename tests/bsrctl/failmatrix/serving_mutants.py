"""How the tests load and switch the TEST-ONLY mutant server module on the failure matrix's
serving rig (``run_matrix(server_module=...)`` / ``ServingRig(..., server_module)``).

The LMCache server process imports ``MUTANT_SERVER.module_path`` (the top-level module
``failmatrix_mutants`` in this folder); ``MUTANT_SERVER.pythonpath`` is prepended to the
PYTHONPATH it inherits: this folder and the repository root, so that it imports the mutant and
this checkout's bsrctl rather than whatever bsrctl the venv has installed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import failmatrix_mutants

from bsrctl.experiments.failmatrix import ServerModule, ServingRig

REPO = Path(__file__).resolve().parents[3]
MUTANT_SERVER = ServerModule(
    module_path=failmatrix_mutants.MODULE_PATH,
    config={"mutations": []},  # none: it behaves exactly like the real module
    pythonpath=(str(failmatrix_mutants.MODULE_DIR), str(REPO)),
)


def set_mutations(rig: ServingRig, mutations: list[str]) -> None:
    """Switch the live server's mutations (``bsr.mutation``), and those of a restarted one."""
    ext = rig.stack.extensions
    assert rig.client is not None and ext is not None
    out = rig.client.call("bsr.mutation", {"mutations": list(mutations)})
    assert out.get("ok"), f"bsr.mutation refused: {out.get('error')}"
    module = ext.server_module
    module = replace(module, config={**module.config, "mutations": list(mutations)})
    rig.stack.extensions = replace(ext, server_module=module)
