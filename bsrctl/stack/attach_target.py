"""The attach target: ladder-free restore experiments (sweep, law) on a deployment an operator
started. The measure path is ``RunningStackTarget``'s, the same as on the launched stack; what
differs is that `deploy` only connects (endpoints probed, the BSR server module checked,
W and B set over ``bsr.configure``) and `teardown` gives W and B back and closes its socket.
L1 is the operator's: `deploy` cannot size it, the evidence records what the server reports.
"""

from __future__ import annotations

from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.settings import RestoreSettings
from bsrctl.stack.running_target import RunningStackTarget


class AttachTarget(RunningStackTarget):
    kind = "attach"

    def _connect(self, settings: RestoreSettings) -> None:
        """Probe every endpoint (bounded), check the module, open the bsr.* client."""
        from bsrctl.stack.attach import AttachedStack
        from bsrctl.stack.bsr_client import BsrModuleClient

        if self.stack is not None:
            return
        stack = AttachedStack(self.spec.stack, self.run_dir)
        stack.up(settings)
        self.stack = stack
        assert self.spec.stack.attach is not None
        self.client = BsrModuleClient(stack, timeout_s=max(30.0, 2 * stack.at.connect_timeout_s))
        status = self.client.status()
        if status.degraded:
            raise StackFailed(f"BSR server module degraded: {status.degraded}")
        self.operator_config = {
            "window_chunks": status.effective_window_chunks,
            "admission_budget_chunks": status.effective_budget_chunks,
        }
        self.window_chunks = status.effective_window_chunks
        self.live = self.client.registration()

    def _before_prepare(self) -> None:
        # An endpoint that does not answer ends the run before anything is computed.
        self._connect(self.spec.settings(0))

    @property
    def tier(self) -> str:
        tiers = self.stack.tiers() if self.stack is not None else []
        return tiers[0] if tiers else super().tier

    def deploy(self, l1_bytes: int, settings: RestoreSettings) -> None:
        """Connect (once) and set this point's W and B; L1 stays the operator's."""
        self._connect(settings)
        self.deployments += 1
        self.settings = settings
        self.client.configure(
            window_chunks=settings.window_chunks,
            admission_budget_chunks=settings.admission_budget_chunks if settings.window_chunks
            else 0,
        )  # fmt: skip
        self.window_chunks = settings.window_chunks

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "attach", "registration": self.reg.to_dict()}
        if self.stack is not None:
            out.update(
                versions=self.stack.versions(),
                endpoints=self.stack.endpoints(),
                reported=self.stack.settings_reported(),
                l1_capacity_bytes=self.client.peak().l1_capacity_bytes,
                tier=self.tier,
                registration_live=[r.to_json() for r in self.live.registrations]
                if self.live
                else [],
                **self.stack.state(),
            )
        return out

    def teardown(self) -> None:
        """Give the operator's W and B back; stop nothing."""
        if self.client is not None:
            try:
                self.client.configure(**getattr(self, "operator_config", {}))
            except (StackFailed, OSError):
                pass  # the deployment went away: nothing of ours to restore
            self.client.close()
            self.client = None
        self.stack = None

    def cleanup(self) -> None:
        self.teardown()
