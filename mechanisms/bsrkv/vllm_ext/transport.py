"""How the runtime adapter reaches the controller: the LMCacheMPConnector's scheduler-side
request clients and their ``server_module_call`` (to bsrctl's server module), or a record
(tests, and a vLLM with no connector). Replies are collected on a later step; a send
waits only when asked (an arrival's claim, bounded), for its own reply to be back."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bsrkv.control_token import CONTROL_TOKEN_ENV, sealed


class Transport(Protocol):
    def send(self, method: str, payload: dict[str, Any], wait_s: float = 0.0) -> bool:
        """Send; with ``wait_s`` > 0 wait at most that long for the reply to have arrived
        (it is still collected by ``replies``). True when it arrived (or nothing to wait
        for)."""
        ...

    def replies(self) -> list[tuple[str, dict[str, Any]]]:
        """Replies that arrived since the last call, in send order."""
        ...


class RecordTransport:
    """Every message appended to a JSON-lines file (or kept in memory); no replies."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def send(self, method: str, payload: dict[str, Any], wait_s: float = 0.0) -> bool:
        with self._lock:
            self.sent.append((method, payload))
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps({"method": method, "payload": payload}) + "\n")
        return True

    def replies(self) -> list[tuple[str, dict[str, Any]]]:
        return []


class ServerModuleTransport:
    """``server_module_call`` on every LMCache server the connector talks to (one here);
    futures are polled, never waited on, from the scheduler thread."""

    def __init__(
        self,
        clients: list[Any],
        make_request: Callable[[str, bytes], Any],
        token: str | None = None,
    ) -> None:
        self._clients = clients
        self._make = make_request
        # tempokv.update is mutating: it carries the server module's control token, which a
        # launched stack gives vLLM in $BSRCTL_CONTROL_TOKEN (bsrkv.control_token)
        self._token = token if token is not None else os.environ.get(CONTROL_TOKEN_ENV)
        self._inflight: list[tuple[str, Any]] = []
        self.errors = 0

    @classmethod
    def from_connector(cls, connector: Any) -> ServerModuleTransport | None:
        adapter = getattr(connector, "scheduler_adapter", None)
        clients = getattr(adapter, "req_clients", None)
        if not clients:
            return None
        from lmcache.v1.multiprocess.protocols.server_module import ServerModuleCallRequest

        return cls(list(clients.values()), ServerModuleCallRequest)

    def send(self, method: str, payload: dict[str, Any], wait_s: float = 0.0) -> bool:
        body = json.dumps(sealed(method, payload, self._token)).encode()
        futs = [client.server_module_call(self._make(method, body)) for client in self._clients]
        self._inflight.extend((method, f) for f in futs)
        if wait_s <= 0:
            return True
        deadline = time.monotonic() + wait_s
        return all(f.wait(max(0.0, deadline - time.monotonic())) for f in futs)

    def replies(self) -> list[tuple[str, dict[str, Any]]]:
        out, still = [], []
        for method, fut in self._inflight:
            if not fut.query():
                still.append((method, fut))
                continue
            try:
                resp = fut.result(timeout=0)
                if resp.success:
                    out.append((method, json.loads(resp.payload.decode() or "{}")))
                else:
                    self.errors += 1
            except Exception:
                self.errors += 1
        self._inflight = still
        return out
