"""The control token: who may call the server module's mutating methods.

Anyone who reaches LMCache's MP port can send ``server_module_call``; the methods that change
what the server does (``MUTATING``) answer only a caller holding the operator's token. A
request's payload is a JSON object, its envelope: a mutating call carries the token under
``control_token``, which the server takes out (``Envelope.read``) before the method reads the
rest, so every method's own reader still refuses an unknown key. The token the server holds
comes from its environment (``BSRKV_CONTROL_TOKEN``) or its ``--server-module`` config
(``control_token``); without one every mutating method is refused (fail closed): an attached
deployment whose operator forgot the token stays closed, and a harness that launches the stack
always makes one (``new_token``). Read-only methods (``READ_ONLY``) answer anyone.

Pure (stdlib only): the server module, its clients and the vLLM adapter all import it.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CONTROL_TOKEN_KEY = "control_token"  # in the request envelope and the --server-module config
CONTROL_TOKEN_ENV = "BSRKV_CONTROL_TOKEN"  # the server's (and a launched vLLM's) environment
REFUSED = "control token"  # a refusal's ``refused`` value

MUTATING = frozenset(
    {
        "bsr.configure",  # W, B, timeouts
        "bsr.forget",  # empties L1
        "bsr.reset_peak",  # starts a new measurement period (hides a peak)
        "bsr.fault",  # arms and clears fault rules (stats and list too: one method)
        "tempokv.configure",  # (re)starts or stops TempoKV's controller
        "tempokv.update",  # claims, cancellations: stages objects into L1
    }
)
READ_ONLY = frozenset(
    {
        "bsr.status",
        "bsr.peak",
        "bsr.markers",
        "bsr.registration",
        "bsr.holds",  # a lookup-and-lock, then unlock: nothing stays changed
        "tempokv.status",
    }
)


class EnvelopeError(ValueError):
    """A payload that is not a JSON object, or whose token is not a string."""


def new_token() -> str:
    """A launched stack's own token (256 bits)."""
    return secrets.token_hex(32)


def token_matches(expected: str, given: str) -> bool:
    """The comparison, in time independent of where the two differ."""
    return hmac.compare_digest(expected.encode(), given.encode())


def server_token(config_value: Any, env_value: str | None) -> str | None:
    """The token a server holds: its config's ``control_token`` or its environment's
    (None: none set, every mutating method refused). Both set and different is an error."""
    if config_value is not None and not isinstance(config_value, str):
        raise ValueError(f"{CONTROL_TOKEN_KEY} must be a string")
    from_config, from_env = config_value or None, env_value or None
    if from_config and from_env and not token_matches(from_config, from_env):
        raise ValueError(
            f"{CONTROL_TOKEN_KEY} in the --server-module config and ${CONTROL_TOKEN_ENV} "
            "differ: set one of them"
        )
    return from_config or from_env


@dataclass(frozen=True)
class Envelope:
    """One request: its method, the token it carries (None: none) and the method's body."""

    method: str
    token: str | None
    body: dict[str, Any]

    @classmethod
    def read(cls, method: str, raw: bytes) -> Envelope:
        try:
            data = json.loads(raw.decode()) if raw else {}
        except (UnicodeDecodeError, ValueError):
            raise EnvelopeError(f"{method}: the payload is not JSON") from None
        if not isinstance(data, dict):
            raise EnvelopeError(f"{method}: the payload is not a JSON object")
        token = data.pop(CONTROL_TOKEN_KEY, None)
        if token is not None and not isinstance(token, str):
            raise EnvelopeError(f"{method}: {CONTROL_TOKEN_KEY} is not a string")
        return cls(method, token, data)

    def body_bytes(self) -> bytes:
        return json.dumps(self.body).encode()


def sealed(method: str, body: Mapping[str, Any] | None, token: str | None) -> dict[str, Any]:
    """The payload of a call: ``body``, plus the token when the method is mutating."""
    out = dict(body or {})
    if token and method in MUTATING:
        out[CONTROL_TOKEN_KEY] = token
    return out


def refusal(method: str, expected: str | None, given: str | None) -> str:
    """'' when ``method`` may run with token ``given``, else why not (naming the method)."""
    if method not in MUTATING:
        return ""
    if expected is None:
        return (
            f"{method}: refused: no control token is configured on this server (set "
            f"${CONTROL_TOKEN_ENV} in its environment, or {CONTROL_TOKEN_KEY} in its "
            "--server-module config); mutating methods are closed without one"
        )
    if given is None:
        return f"{method}: refused: control token required"
    if not token_matches(expected, given):
        return f"{method}: refused: control token wrong"
    return ""
