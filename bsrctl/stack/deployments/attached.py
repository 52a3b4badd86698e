"""The attached deployment: the operator's vLLM + LMCache (with the BSR server module)
+ Mooncake as a ``Deployment`` (``bsrctl.stack.contracts.deployment``), reached over the
endpoints of ``AttachedStack`` (``bsrctl.stack.attach.stack``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.specs import StackSpec
from bsrctl.stack.attach.stack import AttachedStack
from bsrctl.stack.contracts.bsr_client import BsrModuleClient
from bsrctl.stack.contracts.deployment import (
    TIMEOUTS,
    FollowUp,
    Say,
    check_module,
    configure_request,
    follow_up,
)
from bsrkv.lmcache_ext.bsr.protocol import ConfigureRequest, RegistrationReply
from bsrkv.settings import RestoreSettings


class AttachedDeployment:
    """The operator's deployment as a ``Deployment`` (``bsrctl.stack.contracts.deployment``): `up`
    connects once (endpoints probed, the module checked, the geometry compared), remembers
    the module's W, B and timeouts and sets the run's; `down` gives them back and closes the
    client. It starts and stops none of the operator's processes; a restart is the
    operator's command, run only when the spec names it."""

    kind = "attach"

    def __init__(
        self,
        spec: StackSpec,
        run_dir: Path,
        settings: RestoreSettings | None = None,
        client_timeout_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.stack = AttachedStack(spec, run_dir)
        self.settings = settings if settings is not None else RestoreSettings()
        self.client_timeout_s = client_timeout_s or max(30.0, 2 * self.stack.at.connect_timeout_s)
        self.client: BsrModuleClient | None = None
        self.live: RegistrationReply | None = None
        # the module's own W, B, read-back and timeouts, given back at `down`
        self.operator_config: ConfigureRequest | None = None
        self.ups = 0

    def check(self) -> None:
        """Connect: an endpoint that does not answer ends the run before anything is computed."""
        if self.client is not None:
            return
        self.stack.up(self.settings)
        self.client = BsrModuleClient(self.stack, timeout_s=self.client_timeout_s)
        self.stack.bsr = self.client
        self.live = check_module(self.client)
        config = self.client.status().config
        keys = ("window_chunks", "admission_budget_chunks", "readback", *TIMEOUTS)
        own = {k: config[k] for k in keys if k in config}
        self.operator_config = ConfigureRequest.from_json(own)

    @property
    def l1_capacity_bytes(self) -> int | None:
        """The operator's server's L1 (None before connecting)."""
        return self.client.peak().l1_capacity_bytes if self.client is not None else None

    def up(self, settings: RestoreSettings, l1_bytes: int | None = None) -> None:
        """Connect (once) and set these W, B and timeouts; L1 stays the operator's."""
        self.settings = settings
        self.check()
        self.ups += 1
        assert self.client is not None
        self.client.configure(configure_request(settings))

    def configure(self, window_chunks: int, budget_chunks: int, readback: bool) -> None:
        assert self.client is not None
        request = ConfigureRequest(
            window_chunks=window_chunks, admission_budget_chunks=budget_chunks, readback=readback
        )
        self.client.configure(request)

    def reconnect(self) -> BsrModuleClient:
        """A restarted server runs the operator's config: the run's settings again."""
        if self.client is not None:
            self.client.close()
        self.client = BsrModuleClient(self.stack, timeout_s=self.client_timeout_s)
        self.stack.bsr = self.client
        self.client.configure(configure_request(self.settings))
        return self.client

    def restart(self, part: str, say: Say) -> None:
        """The operator's restart command for ``part``, then its health, bounded."""
        say(f"  restarting {part} (the operator's command)")
        self.stack.run_command(f"restart_{part}")
        self.stack.wait_healthy(part, 60.0)
        if part == "lmcache":
            self.reconnect()

    def ensure_up(self, say: Say) -> None:
        bad = sorted(n for n, h in self.stack.health().items() if not h.get("healthy"))
        if bad:
            raise StackFailed(f"attach: {bad} not healthy before the cell (the operator's)")

    def follow_up(
        self, ids: list[int], max_tokens: int, canonical: tuple[int, ...] | None = None
    ) -> FollowUp:
        return follow_up(self.stack, ids, max_tokens, canonical)

    @property
    def tier(self) -> str:
        """The first tier the server reports (FS first); the spec's before connecting."""
        tiers = self.stack.tiers() if self.client is not None else []
        return tiers[0] if tiers else ("fs" if self.spec.lmcache.fs_l2 else "mooncake")

    def vllm_log(self) -> Path | None:
        return self.stack.vllm_log()

    def audit(self, stopped: list[int]) -> tuple[list[int], dict[str, bool]]:
        """bsrctl holds none of the operator's PIDs: every part answers, nothing to be gone."""
        return [], {n: bool(h.get("healthy")) for n, h in self.stack.health().items()}

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "attach"}
        if self.client is None:
            return out
        st = self.stack
        live = [r.to_json() for r in self.live.registrations] if self.live else []
        return {
            **out,
            "versions": st.versions(),
            "endpoints": st.endpoints(),
            "settings": self.settings.to_json(),  # what the run set over bsr.configure
            "reported": st.settings_reported(),
            "l1_capacity_bytes": self.client.peak().l1_capacity_bytes,
            "tier": self.tier,
            "registration_live": live,
            **st.state(),
        }

    def down(self) -> None:
        """Give the operator's W, B and timeouts back; stop nothing."""
        if self.client is not None:
            if self.operator_config is not None:
                try:
                    self.client.configure(self.operator_config)
                except (StackFailed, OSError):
                    pass  # the deployment went away: nothing of ours to give back
            self.client.close()
            self.client = self.stack.bsr = None
