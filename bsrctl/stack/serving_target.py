"""The serving target: vLLM + LMCache MP server (+ Mooncake) with the BSR server module,
every process by PID, launched by bsrctl. W is switched per point over ``bsr.configure``; the
measure path is ``RunningStackTarget``'s (shared with an attached deployment)."""

from __future__ import annotations

from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.settings import RestoreSettings
from bsrctl.stack.running_target import RunningStackTarget


class ServingTarget(RunningStackTarget):
    """vLLM + LMCache MP server (+ Mooncake) with the BSR server module, by PID."""

    kind = "serving"

    def _before_prepare(self) -> None:
        from bsrctl.stack.serving import check_ports

        check_ports(self.spec.stack)

    def deploy(self, l1_bytes: int, settings: RestoreSettings) -> None:
        """A fresh deployment (its own folder under the run): LMCache with this L1 and W."""
        from bsrctl.stack.bsr_client import BsrModuleClient
        from bsrctl.stack.extensions import bsr_extensions
        from bsrctl.stack.serving import ServingStack

        lm = self.spec.stack.lmcache.model_copy(update={"l1_size_bytes": l1_bytes})
        spec = self.spec.stack.model_copy(update={"lmcache": lm})
        self.deployments += 1
        sub = "." if self.deployments == 1 else f"deploy-{self.deployments}"
        self.stack = ServingStack(spec, self.run_dir / sub, bsr_extensions(settings))
        if self.deployments > 1 and spec.lmcache.fs_l2:
            # Every deployment of a run shares the first one's FS L2 (what it stored stays
            # restorable); each keeps its own logs and state.
            first = self.run_dir / "stack" / "l2-fs"
            first.mkdir(parents=True, exist_ok=True)
            self.stack.dir.mkdir(parents=True, exist_ok=True)
            (self.stack.dir / "l2-fs").symlink_to(first.resolve(), target_is_directory=True)
        self.stack.up()  # stops what it started if it fails
        self.client = BsrModuleClient(self.stack)
        self.settings, self.window_chunks = settings, settings.window_chunks
        status = self.client.status()
        if status.degraded:
            raise StackFailed(f"BSR server module degraded: {status.degraded}")
        self.live = self.client.registration()

    def describe(self) -> dict[str, Any]:
        if self.stack is None:
            return {"kind": "serving", "registration": self.reg.to_dict()}
        live = [r.to_json() for r in self.live.registrations] if self.live else []
        return {
            "kind": "serving",
            "versions": self.stack.versions(),
            "registration": self.reg.to_dict(),
            "registration_live": live,  # REGISTER_KV_CACHE as the server module saw it
            **self.stack.state(),
        }

    def teardown(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.stack is not None:
            self.stack.down()
            self.stack = None

    def cleanup(self) -> None:
        self.teardown()
