"""The control token at the server module's door: ``mutating(method)`` registers a handler
that runs only for a caller holding the token (``bsrctl.control_token``).

The guard reads the envelope, takes the token out and compares it with the server's; a
refusal is a ``RefusedReply`` naming the method and "control token", and the handler never
runs (nothing changes). The handler gets the body without the token, so its own reader
still refuses an unknown key.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from lmcache.v1.multiprocess.ext_server_module import server_module_handler

from bsrctl.control_token import MUTATING, Envelope, EnvelopeError, refusal
from bsrctl.lmcache_ext.protocol import RefusedReply

Handler = Callable[[Any, bytes], bytes]
GUARDED = "_bsr_guarded"  # set on every guarded handler (the tests enumerate them)


def refused_bytes(method: str, error: str) -> bytes:
    return json.dumps(RefusedReply.of(method, error).to_json(), sort_keys=True).encode()


def admit(method: str, expected: str | None, raw: bytes) -> tuple[bytes | None, bytes]:
    """(the refusal to answer, or None) and the body to run the method with."""
    try:
        env = Envelope.read(method, raw)
    except EnvelopeError as exc:
        return refused_bytes(method, f"{exc} (the control token travels in it)"), b""
    why = refusal(method, expected, env.token)
    return (refused_bytes(method, why) if why else None), env.body_bytes()


def mutating(method: str) -> Callable[[Handler], Handler]:
    """``server_module_handler(method)`` behind the control token."""
    if method not in MUTATING:
        raise ValueError(f"{method} is not a mutating method of bsrctl.control_token")

    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        def guarded(self: Any, payload: bytes) -> bytes:
            refused, body = admit(method, self._control_token, payload)
            return refused if refused is not None else fn(self, body)

        setattr(guarded, GUARDED, method)
        return server_module_handler(method)(guarded)

    return decorate
