"""A launched deployment kept up across runs: the first run's ``up`` launches it (by PID, as
``LaunchedDeployment`` does), every later run's ``up`` sets its W, B and timeouts over
bsr.configure, as an attached run does; a run's ``down`` stops nothing, ``close`` stops
everything by PID. The test suite shares one between the e2e modules that only need a
running stack (tests/bsrctl/experiments/restore/conftest.py); each run's evidence is that of a
launched run with one deployment (``ups`` counts the run's own, ``settings`` are the run's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrctl.stack.contracts.bsr_client import BsrModuleClient
from bsrctl.stack.contracts.deployment import FollowUp, Say, configure_request
from bsrctl.stack.deployments.launched import LaunchedDeployment
from bsrkv.lmcache_ext.bsr.protocol import RegistrationReply
from bsrkv.settings import RestoreSettings


def _launch_only(settings: RestoreSettings) -> dict[str, Any]:
    """The settings bsr.configure does not set: fixed when the module was loaded."""
    at_run_time = set(configure_request(settings).changes())
    return {k: v for k, v in settings.model_dump().items() if k not in at_run_time}


class KeptDeployment:
    """``Deployment`` over one ``LaunchedDeployment`` that outlives the runs on it."""

    kind = "serving"

    def __init__(self, launched: LaunchedDeployment) -> None:
        self.launched = launched
        self.ups = 0  # of the current run: a run on it sees one deployment, as if launched
        self.launches = 0  # how many times the processes were started (one while kept)
        self.l1_bytes: int | None = None  # what it was launched with: every run must ask it

    @property
    def stack(self) -> Any:
        return self.launched.stack

    @property
    def client(self) -> BsrModuleClient | None:
        return self.launched.client

    @property
    def settings(self) -> RestoreSettings:
        return self.launched.settings

    @property
    def live(self) -> RegistrationReply | None:
        return self.launched.live

    @property
    def running(self) -> bool:
        return self.launched.running

    def check(self) -> None:
        if not self.running:  # once up, its ports are its own
            self.launched.check()

    def up(self, settings: RestoreSettings, l1_bytes: int | None = None) -> None:
        """Launch it (first run) or set the run's W, B and timeouts; L1 is fixed at launch."""
        l1 = self.launched.spec.lmcache.l1_size_bytes if l1_bytes is None else l1_bytes
        if not self.running:
            self.launched.up(settings, l1_bytes)
            self.launches += 1
            self.l1_bytes = l1
        elif l1 != self.l1_bytes:
            raise BadInput(f"a kept deployment has L1 {self.l1_bytes} B; this run asks {l1} B")
        elif (fixed := _launch_only(settings)) != _launch_only(self.launched.settings):
            raise BadInput(
                f"a kept deployment was launched with {_launch_only(self.launched.settings)}; "
                f"this run asks {fixed} (only W, B and the timeouts are set at run time)"
            )
        else:
            assert self.client is not None
            self.client.configure(configure_request(settings))
            self.launched.settings = settings  # the evidence's `settings`: the run's
        self.ups += 1

    def configure(self, window_chunks: int, budget_chunks: int, readback: bool) -> None:
        self.launched.configure(window_chunks, budget_chunks, readback)

    def reconnect(self) -> BsrModuleClient:
        client = self.launched.reconnect()
        client.configure(configure_request(self.settings))  # a new LMCache runs the launch's
        return client

    def restart(self, part: str, say: Say) -> None:
        self.launched.restart(part, say)  # a new client after LMCache, which runs the launch's
        if part == "lmcache" and self.client is not None:
            self.client.configure(configure_request(self.settings))

    def ensure_up(self, say: Say) -> None:
        self.launched.ensure_up(say)

    def follow_up(
        self, ids: list[int], max_tokens: int, canonical: tuple[int, ...] | None = None
    ) -> FollowUp:
        return self.launched.follow_up(ids, max_tokens, canonical)

    @property
    def tier(self) -> str:
        return self.launched.tier

    def vllm_log(self) -> Path | None:
        return self.launched.vllm_log()

    def audit(self, stopped: list[int]) -> tuple[list[int], dict[str, bool]]:
        return self.launched.audit(stopped)

    def describe(self) -> dict[str, Any]:
        return self.launched.describe()

    def down(self) -> None:
        """The run is over: the next run counts its own ``up``; nothing is stopped."""
        self.ups = 0

    def close(self) -> None:
        """Stop every process by PID (``LaunchedDeployment.down``)."""
        self.ups = 0
        self.launched.down()
