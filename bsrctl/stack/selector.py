"""The one stack selector: ``stack.kind`` (which ``--stack`` overrides for one run, see
``bsrctl.specs.select_stack``) picks the deployment and the restore target, once.

    serving  LaunchedDeployment (bsrctl starts every process by PID) under RunningTarget
    attach   AttachedDeployment (the operator's processes) under RunningTarget
    storage  StorageTarget (in-process StorageManagers, no model, no vLLM)

Everything downstream reads ``target.kind`` or calls the target; nothing re-derives the stack.
This module sits above the implementations it names, which import only
``bsrctl.stack.contracts.target`` (no import circle: the ``stack-targets`` contract in
pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bsrctl.errors import BadInput
from bsrctl.specs import StackSpec, TargetSpec
from bsrctl.stack.contracts.deployment import Deployment
from bsrctl.stack.contracts.target import Target
from bsrctl.stack.deployments.attached import AttachedDeployment
from bsrctl.stack.deployments.launched import LaunchedDeployment
from bsrctl.stack.launch.extensions import LMCacheExtensions, ServerModule
from bsrctl.stack.measure.target import RunningTarget
from bsrctl.stack.storage.target import StorageTarget
from bsrkv.settings import RestoreSettings

SERVING_KINDS = ("serving", "attach")


def make_deployment(
    stack: StackSpec,
    run_dir: Path,
    settings: RestoreSettings | None = None,
    server_module: ServerModule | None = None,
    client_timeout_s: float | None = None,
    extend: Callable[[LMCacheExtensions], LMCacheExtensions] | None = None,
) -> Deployment:
    """The serving deployment of ``stack.kind``: launched ("serving") or attached.
    ``server_module`` and ``extend`` change what a launched LMCache loads
    (``LaunchedDeployment``)."""
    if stack.kind == "attach":
        if server_module is not None or extend is not None:
            raise BadInput(
                "stack.kind: attach: the operator's LMCache runs its own server module and "
                "L2 adapters; a substitute module or extension needs a launched stack (kind "
                "serving)"
            )
        return AttachedDeployment(stack, run_dir, settings, client_timeout_s)
    if stack.kind == "serving":
        timeout = 120.0 if client_timeout_s is None else client_timeout_s
        return LaunchedDeployment(stack, run_dir, settings, server_module, timeout, extend)
    raise BadInput(f"stack.kind: {stack.kind!r} runs no serving deployment; use serving or attach")


def make_target(spec: TargetSpec, run_dir: Path, deployment: Deployment | None = None) -> Target:
    """The restore target of ``spec.stack.kind``; ``deployment``: run on this one (already
    made, e.g. a ``KeptDeployment`` the test suite shares) instead of a new one."""
    if spec.stack.kind == "storage":
        return StorageTarget(spec, run_dir)
    dep = deployment or make_deployment(spec.stack, run_dir, spec.settings(0))
    return RunningTarget(spec, run_dir, dep)
