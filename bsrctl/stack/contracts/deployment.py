"""One serving deployment (vLLM + LMCache MP server with the BSR server module, + Mooncake),
whoever runs it: what every serving experiment (restore targets, the failure matrix, the
round trip) drives.

    dep = make_deployment(spec.stack, run_dir, settings)   # bsrctl.stack.selector, by kind
    dep.check()                     # before anything is computed: ports free / endpoints answer
    dep.up(settings, l1_bytes)      # a running deployment with these W, B and timeouts
    dep.configure(w, b, readback)   # W, B and the read-back of the next request (bsr.configure)
    dep.stack, dep.client           # its requests and probes; its bsr.* client
    dep.follow_up(ids, n)           # the post-request health check (below)
    dep.describe()                  # the evidence's `stack` block
    dep.down()                      # stop what bsrctl started / give the operator's back

Two implementations, chosen once from ``stack.kind``: ``LaunchedDeployment``
(``bsrctl.stack.deployments.launched``: bsrctl starts and stops every process by PID) and
``AttachedDeployment`` (``bsrctl.stack.attach.stack``: the operator's processes, reached over
their endpoints; bsrctl starts and stops none of them, and gives the module's W, B and
timeouts back at ``down``).

The follow-up health check has one meaning on the serving stacks: after the measured
request, one more request answers in full (all of its ``max_tokens``, or exactly the
canonical output when the caller holds one) and every part reports healthy. (The storage
stack's "follow-up restore" of the failure matrix is a different check: a reseeded prefix
restores in full; it lives with the storage cells.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bsrctl.errors import StackFailed
from bsrctl.stack.contracts.bsr_client import BsrModuleClient
from bsrkv.lmcache_ext.bsr.protocol import ConfigureRequest, RegistrationReply
from bsrkv.settings import RestoreSettings

# The module's settings a deployment sets over bsr.configure (and gives back on attach).
TIMEOUTS = ("window_timeout_s", "probe_timeout_s", "admission_timeout_s", "retrieve_deadline_s",
            "drain_timeout_s", "stall_guard_s")  # fmt: skip
Say = Callable[[str], None]
# The short follow-up of the restore experiments: its first tokens (shorter than any chunk,
# so it stores nothing) and the tokens it must return. The failure matrix sends its own
# health prompt and compares the canonical output.
FOLLOW_UP_PROMPT_TOKENS = 64
FOLLOW_UP_MAX_TOKENS = 4


@dataclass(frozen=True)
class FollowUp:
    """The post-request health check: ``ok`` and what was seen."""

    ok: bool
    detail: str


def follow_up(
    stack: Any, ids: list[int], max_tokens: int, canonical: tuple[int, ...] | None = None
) -> FollowUp:
    """One more request on ``stack`` answers in full (``max_tokens`` tokens, or exactly
    ``canonical`` when given) and every part of the deployment reports healthy."""
    try:
        comp = stack.complete(ids, max_tokens)
        parts = stack.health()
    except StackFailed as exc:
        return FollowUp(False, f"follow-up request failed: {exc}")
    bad = sorted(n for n, h in parts.items() if isinstance(h, dict) and not h.get("healthy"))
    out = comp.output_token_ids
    if canonical is None:
        answered = len(out) == max_tokens
        what = f"follow-up returned {len(out)}/{max_tokens} tokens"
    else:
        answered = tuple(out) == tuple(canonical)
        what = (
            f"follow-up returned {len(out)}/{max_tokens} tokens "
            f"({'canonical' if answered else 'NOT canonical'}) in {comp.ttft_s:.2f} s"
        )
    return FollowUp(answered and not bad, f"{what}; unhealthy parts: {bad or 'none'}")


def configure_request(settings: RestoreSettings) -> ConfigureRequest:
    """The ``bsr.configure`` request of a deployment with ``settings``: W, B (0 on the
    whole-plan path) and the restore timeouts."""
    w = settings.window_chunks
    return ConfigureRequest.from_json(
        {
            "window_chunks": w,
            "admission_budget_chunks": settings.budget_chunks if w else 0,
            **{k: float(getattr(settings, k)) for k in TIMEOUTS},
        }
    )


def check_module(client: BsrModuleClient) -> RegistrationReply:
    """The BSR server module runs with its config (not degraded to W = 0); the live
    registration (what the engines registered with LMCache)."""
    status = client.status()
    if status.degraded:
        raise StackFailed(f"BSR server module degraded: {status.degraded}")
    return client.registration()


class OnDeployment:
    """What runs on a deployment (the restore target, the failure matrix's rig): ``stack``
    and ``client`` are the deployment's, unless a test substituted fakes for them."""

    deployment: Deployment
    _stack: Any = None
    _client: Any = None

    @property
    def stack(self) -> Any:
        return self._stack if self._stack is not None else self.deployment.stack

    @stack.setter
    def stack(self, value: Any) -> None:
        self._stack = value

    @property
    def client(self) -> Any:
        return self._client if self._client is not None else self.deployment.client

    @client.setter
    def client(self, value: Any) -> None:
        self._client = value


class Deployment(Protocol):
    """A running serving deployment (see the module doc)."""

    kind: str  # "serving" (launched) | "attach"
    stack: Any  # ServingStack | AttachedStack: requests, metrics, L1, tiers, faults
    client: BsrModuleClient | None  # its bsr.* client while up
    settings: RestoreSettings  # of the deployment (W switched per request by `configure`)
    live: RegistrationReply | None  # what the engines registered, read at `up`
    ups: int  # how many times `up` ran (the launched stack: one folder each)

    def check(self) -> None:
        """Before anything is computed: the launched stack's ports are free; the attached
        deployment's endpoints answer and run the module (StackFailed naming the first)."""

    def up(self, settings: RestoreSettings, l1_bytes: int | None = None) -> None:
        """A running deployment with these settings: launched, a fresh one (L1 ``l1_bytes``,
        None: the spec's); attached, connect once and set W, B and timeouts (L1 is the
        operator's)."""

    def configure(self, window_chunks: int, budget_chunks: int, readback: bool) -> None:
        """W, B and the install read-back (the oracle) of the next requests, over
        bsr.configure."""

    def reconnect(self) -> BsrModuleClient:
        """A new bsr.* client after LMCache restarted (attached: the settings set again)."""

    def restart(self, part: str, say: Say) -> None:
        """Restart one part ("vllm" | "lmcache"): by PID, or the operator's command."""

    def ensure_up(self, say: Say) -> None:
        """Every part up before the next cell: launched, restart what a cell left down;
        attached, StackFailed when a part is unhealthy (the operator's)."""

    def follow_up(
        self, ids: list[int], max_tokens: int, canonical: tuple[int, ...] | None = None
    ) -> FollowUp:
        """The post-request health check (the module doc)."""

    @property
    def tier(self) -> str:
        """The L2 tier restores read: FS when the deployment has one, else Mooncake."""

    def vllm_log(self) -> Path | None:
        """vLLM's log on this host (None: not readable here)."""

    def audit(self, stopped: list[int]) -> tuple[list[int], dict[str, bool]]:
        """PIDs that should be gone but are alive, and whether each current part is up."""

    def describe(self) -> dict[str, Any]:
        """The evidence's `stack` block: kind, versions, endpoints/state, what the servers
        report, the live registration."""

    def down(self) -> None:
        """Launched: stop every process by PID. Attached: give the operator's W, B and
        timeouts back, close the client, stop nothing."""
