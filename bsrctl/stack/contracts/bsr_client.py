"""Reading BSR's restore pool on the serving stack: the server module's ``bsr.*`` handlers.

The LMCache server loads ``bsrkv.lmcache_ext.server``; its handlers are reachable
through LMCache's own ``server_module_call`` RPC (JSON in, JSON out) on the server's MQ port,
and its ``status()`` also appears under ``"bsr"`` in LMCache's HTTP ``/status``.

Each method returns the typed reply of ``bsrkv.lmcache_ext.bsr.protocol`` (the server builds the
same types): ``peak()`` (the gauge's restore-pool peak per rank, L1 usage), ``reset_peak()``,
``status()``, ``markers()``, ``forget(wait_s)`` (empty L1, waiting for write-throughs),
``configure(ConfigureRequest(window_chunks=...))`` (W at run time, same engines).

A mutating call carries the stack's control token (``bsrkv.control_token``: a launched
stack's own, an attached one's from ``stack.attach.control_token_env``); a refusal raises
StackFailed naming where the token comes from. Every call is bounded; a failed call, or a
reply of another shape, raises StackFailed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from bsrctl.errors import StackFailed
from bsrctl.stack.attach.prerequisites import control_token_refused
from bsrctl.stack.launch.netns import maybe_inside
from bsrctl.stack.launch.serving import ServingClient
from bsrkv.control_token import sealed
from bsrkv.lmcache_ext.bsr.protocol import (
    ConfigureReply,
    ConfigureRequest,
    FailedReply,
    ForgetReply,
    HoldsReply,
    MarkersReply,
    PeakReply,
    ProtocolError,
    RefusedReply,
    RegistrationReply,
    Reply,
    ResetPeakReply,
    RestoreOutcomeSummary,
    StatusReply,
)

R = TypeVar("R", bound=Reply)


class BsrModuleClient:
    """server_module_call client for one LMCache server (recreate after a restart)."""

    def __init__(self, stack: ServingClient, timeout_s: float = 120.0) -> None:
        self.stack = stack
        self.timeout_s = timeout_s
        self._client: Any = None
        self._zmq: Any = None

    def _connect(self) -> Any:
        if self._client is None:
            import zmq
            from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

            url = self.stack.lmcache_mq_url
            with maybe_inside(self.stack.ns):  # the socket's I/O thread joins the namespace
                self._zmq = zmq.Context()
                self._client = RequestClientFactory.create(url, context=self._zmq)
        return self._client

    def call(self, method: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        from lmcache.v1.multiprocess.protocols.server_module import ServerModuleCallRequest

        body = sealed(method, payload, self.stack.control_token)
        req = ServerModuleCallRequest(method=method, payload=json.dumps(body).encode())
        try:
            resp = self._connect().server_module_call(req).result(timeout=self.timeout_s)
        except Exception as exc:
            part = self.stack.parts.get("lmcache")
            raise StackFailed(
                f"LMCache server_module_call {method} failed ({exc!r}); is the BSR server "
                f"module loaded?",
                part.tail() if part else "",
            ) from None
        if not resp.success:
            raise StackFailed(f"LMCache {method} answered an error: {resp.error}")
        out = json.loads(resp.payload)
        if FailedReply.is_failure(out):
            raise StackFailed(f"LMCache {method} failed in the server module: {out.get('error')}")
        if RefusedReply.is_refusal(out):
            try:
                error = RefusedReply.from_json(out).error
            except ProtocolError as exc:
                error = str(exc)
            raise StackFailed(control_token_refused(error, self.stack.control_token_source))
        return out

    def _typed(self, method: str, reply: type[R], payload: dict[str, Any] | None = None) -> R:
        """One call read back as its typed reply: a key renamed on either side is a
        StackFailed naming it, never a silent None."""
        try:
            return reply.from_json(self.call(method, payload))
        except ProtocolError as exc:
            raise StackFailed(f"LMCache {method} answered an unexpected shape: {exc}") from None

    def peak(self) -> PeakReply:
        return self._typed("bsr.peak", PeakReply)

    def reset_peak(self) -> ResetPeakReply:
        return self._typed("bsr.reset_peak", ResetPeakReply)

    def status(self) -> StatusReply:
        return self._typed("bsr.status", StatusReply)

    def markers(self) -> MarkersReply:
        return self._typed("bsr.markers", MarkersReply)

    def registration(self) -> RegistrationReply:
        """The KV cache layouts the engines registered (the live registration)."""
        return self._typed("bsr.registration", RegistrationReply)

    def holds(self, token_ids: list[int], model_name: str, world_size: int = 1) -> HoldsReply:
        """The prompt's whole chunks each L2 adapter holds, by a real lookup on the server."""
        payload = {"model_name": model_name, "world_size": world_size, "token_ids": token_ids}
        return self._typed("bsr.holds", HoldsReply, payload)

    def forget(self, wait_s: float = 60.0) -> ForgetReply:
        """Empty L1. The server waits at most a few seconds per call (write-throughs may
        still hold objects), so ask again until L1 is empty or wait_s has passed."""
        deadline = time.monotonic() + wait_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            out = self._typed("bsr.forget", ForgetReply, {"wait_s": left})
            if out.l1_used_bytes_after == 0 or time.monotonic() >= deadline:
                return out
            time.sleep(0.2)

    def configure(self, request: ConfigureRequest) -> ConfigureReply:
        changes = request.changes()
        out = self._typed("bsr.configure", ConfigureReply, changes)
        if not out.ok:
            raise StackFailed(f"bsr.configure {changes} refused: {out.error}")
        return out

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
        if self._zmq is not None:
            self._zmq.destroy(linger=0)
        self._client = self._zmq = None


def outcomes_since(
    before: Sequence[RestoreOutcomeSummary], after: Sequence[RestoreOutcomeSummary]
) -> list[RestoreOutcomeSummary]:
    """The restore outcomes recorded between two reads of ``recent_outcomes`` (``bsr.status``):
    those of ``after`` whose (request id, rank) ``before`` did not hold, in server order.

    Every outcome the module records carries its request's id and rank, and a request id
    names one request, so this is exact with requests sent one at a time. A delta of the
    ``retrieves`` counter is not: a retrieve refused before any restore (no transfer module,
    an unregistered instance, a raised error) counts without recording an outcome, and the
    last k outcomes then include an earlier request's."""
    seen = {(o.request_id, o.rank) for o in before}
    return [o for o in after if (o.request_id, o.rank) not in seen]
