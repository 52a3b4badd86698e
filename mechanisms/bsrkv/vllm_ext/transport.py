"""How the runtime adapter reaches the controller: the LMCacheMPConnector's scheduler-side
request clients and their ``server_module_call`` (to bsrkv's server module), or a record
(tests, and a vLLM with no connector). A send never waits: it returns its reply's
``Pending``, which the adapter waits on (bounded) only where it must (an arrival's claim,
before a schedule() that may look its request up); replies are collected on a later step."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from bsrkv.control_token import CONTROL_TOKEN_ENV, sealed


class Pending(Protocol):
    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` (0: just look) for the reply to have arrived (it is
        still collected by ``replies``). True when it arrived, or there is none to wait for."""
        ...


class _Answered:
    def wait(self, timeout_s: float) -> bool:
        return True


ANSWERED: Pending = _Answered()  # a send with no reply to wait for (a record)


class _Replies:
    """The futures of one send, one per server."""

    def __init__(self, futures: list[Any]) -> None:
        self._futures = futures

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(f.wait(max(0.0, deadline - time.monotonic())) for f in self._futures)


class Transport(Protocol):
    def send(self, method: str, payload: dict[str, Any]) -> Pending:
        """Send, never waiting: the reply's ``Pending``."""
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

    def send(self, method: str, payload: dict[str, Any]) -> Pending:
        with self._lock:
            self.sent.append((method, payload))
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps({"method": method, "payload": payload}) + "\n")
        return ANSWERED

    def replies(self) -> list[tuple[str, dict[str, Any]]]:
        return []


class ServerModuleTransport:
    """``server_module_call`` on every LMCache server the connector talks to (one here);
    futures are polled from the scheduler thread, waited on only through their ``Pending``."""

    def __init__(
        self,
        clients: list[Any],
        make_request: Callable[[str, bytes], Any],
        token: str | None = None,
    ) -> None:
        self._clients = clients
        self._make = make_request
        # tempokv.update is mutating: it carries the server module's control token, which a
        # launched stack gives vLLM in $BSRKV_CONTROL_TOKEN (bsrkv.control_token)
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

    def send(self, method: str, payload: dict[str, Any]) -> Pending:
        body = json.dumps(sealed(method, payload, self._token)).encode()
        futs = [client.server_module_call(self._make(method, body)) for client in self._clients]
        self._inflight.extend((method, f) for f in futs)
        return _Replies(futs)

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
