"""The launched deployment: bsrctl starts vLLM + LMCache (+ Mooncake) with the BSR server
module, every process by PID, and stops them by PID (``bsrctl.stack.contracts.deployment``).

Each ``up`` is a fresh deployment in its own folder under the run (the first in the run's
own ``stack/``, then ``deploy-N/stack/``); they all share the first one's FS L2, so what one
stored stays restorable by the next. The settings are the server module's config at launch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsrctl.specs import StackSpec
from bsrctl.stack.contracts.bsr_client import BsrModuleClient
from bsrctl.stack.contracts.deployment import FollowUp, Say, check_module, follow_up
from bsrctl.stack.launch.extensions import LMCacheExtensions, ServerModule, bsr_extensions
from bsrctl.stack.launch.process import pids_alive
from bsrctl.stack.launch.serving import ServingStack, check_ports
from bsrkv.lmcache_ext.bsr.protocol import ConfigureRequest, RegistrationReply
from bsrkv.settings import RestoreSettings


class LaunchedDeployment:
    """vLLM + LMCache MP server (+ Mooncake) with the BSR server module, by PID.

    ``server_module``: another module with the same config (the failure matrix's test-only
    mutants); ``extend``: what LMCache loads beyond BSR's extensions (TempoKV's shaped L2 and
    runtime adapter: ``lambda e: replace(e, l2_device=..., tempokv=...)``);
    ``client_timeout_s``: how long one bsr.* call may take."""

    kind = "serving"

    def __init__(
        self,
        spec: StackSpec,
        run_dir: Path,
        settings: RestoreSettings | None = None,
        server_module: ServerModule | None = None,
        client_timeout_s: float = 120.0,
        extend: Callable[[LMCacheExtensions], LMCacheExtensions] | None = None,
    ) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.server_module = server_module
        self.extend = extend
        self.client_timeout_s = client_timeout_s
        self.settings = settings if settings is not None else RestoreSettings()
        # The first deployment's stack exists before `up` (its folder names the run's files).
        self.stack = ServingStack(spec, self.run_dir, self.extensions(self.settings))
        self.client: BsrModuleClient | None = None
        self.live: RegistrationReply | None = None
        self.ups = 0
        self.running = False  # between a started `up` and `down`: what `down` must stop

    def extensions(self, settings: RestoreSettings) -> LMCacheExtensions:
        """What LMCache loads: the BSR server module (or the substitute) with ``settings``."""
        m = self.server_module
        ext = (
            bsr_extensions(settings)
            if m is None
            else bsr_extensions(settings, m.module_path, m.config, m.pythonpath)
        )
        return ext if self.extend is None else self.extend(ext)

    def check(self) -> None:
        check_ports(self.spec)

    def up(self, settings: RestoreSettings, l1_bytes: int | None = None) -> None:
        self.ups += 1
        spec = self.spec
        if l1_bytes is not None:
            lm = spec.lmcache.model_copy(update={"l1_size_bytes": l1_bytes})
            spec = spec.model_copy(update={"lmcache": lm})
        if self.ups > 1 or settings != self.settings or spec != self.spec:
            sub = "." if self.ups == 1 else f"deploy-{self.ups}"
            self.stack = ServingStack(spec, self.run_dir / sub, self.extensions(settings))
        if self.ups > 1 and spec.lmcache.fs_l2:
            first = self.run_dir / "stack" / "l2-fs"
            first.mkdir(parents=True, exist_ok=True)
            self.stack.dir.mkdir(parents=True, exist_ok=True)
            (self.stack.dir / "l2-fs").symlink_to(first.resolve(), target_is_directory=True)
        self.settings = settings
        self.running = True
        self.stack.up()  # stops what it started if it fails
        self.client = BsrModuleClient(self.stack, timeout_s=self.client_timeout_s)
        self.live = check_module(self.client)

    def configure(self, window_chunks: int, budget_chunks: int, readback: bool) -> None:
        assert self.client is not None
        request = ConfigureRequest(
            window_chunks=window_chunks, admission_budget_chunks=budget_chunks, readback=readback
        )
        self.client.configure(request)

    def reconnect(self) -> BsrModuleClient:
        if self.client is not None:
            self.client.close()
        self.client = BsrModuleClient(self.stack, timeout_s=self.client_timeout_s)
        return self.client

    def restart(self, part: str, say: Say) -> None:
        """Stop ``part`` by PID (if it still runs) and start it again; a new client after
        LMCache. Its state is on record at once (the audit reads the new PIDs)."""
        st = self.stack
        say(f"  restarting {part}")
        old = st.parts.pop(part, None)
        if old is not None:
            old.stop()
        (st.start_lmcache if part == "lmcache" else st.start_vllm)()
        if part == "lmcache":
            self.reconnect()
        st.save_state()

    def ensure_up(self, say: Say) -> None:
        for name in ("lmcache", "vllm"):
            part = self.stack.parts.get(name)
            if part is None or not part.alive():
                self.restart(name, lambda m: say(f"{m} (left down)"))
        self.stack.save_state()

    def follow_up(
        self, ids: list[int], max_tokens: int, canonical: tuple[int, ...] | None = None
    ) -> FollowUp:
        return follow_up(self.stack, ids, max_tokens, canonical)

    @property
    def tier(self) -> str:
        return "fs" if self.spec.lmcache.fs_l2 else "mooncake"

    def vllm_log(self) -> Path | None:
        return self.stack.dir / "vllm.log"

    def audit(self, stopped: list[int]) -> tuple[list[int], dict[str, bool]]:
        """Stopped and replaced PIDs are gone; every current part is alive."""
        st = self.stack
        current = set(st.all_pids())
        if st.mooncake is not None:
            current |= {p for p in st.mooncake.pids().values() if p}
        replaced = [p.pid for p in st.launched if p.pid and p.pid not in current]
        gone_expected = sorted({*stopped, *replaced} - current)
        alive = {n: p.alive() for n, p in st.parts.items()}
        if st.mooncake is not None:
            alive |= {
                "mooncake-master": st.mooncake.master.alive(),
                "mooncake-node": st.mooncake.node.alive(),
            }
        return pids_alive(gone_expected), alive

    def describe(self) -> dict[str, Any]:
        live = [r.to_json() for r in self.live.registrations] if self.live else []
        return {
            "kind": "serving",
            "versions": self.stack.versions(),
            "settings": self.settings.to_json(),  # the module's config at launch
            "registration_live": live,  # REGISTER_KV_CACHE as the server module saw it
            **self.stack.state(),
        }

    def down(self) -> None:
        """Stop every process of the current deployment by PID; a second call is a no-op."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.running:
            self.stack.down()
            self.running = False
