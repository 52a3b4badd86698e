"""The server module's door: ``handler(method)`` registers a ``server_module_call`` method
whose exception is a ``FailedReply`` (counted on the module's guard, logged once: never
raised into LMCache's router, which would log it at every call); ``mutating(method)`` is
that, behind the control token (``bsrkv.control_token``).

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

from bsrkv.control_token import MUTATING, Envelope, EnvelopeError, refusal
from bsrkv.hostguard import guarded
from bsrkv.lmcache_ext.bsr.protocol import FailedReply, RefusedReply

Handler = Callable[[Any, bytes], bytes]
GUARDED = "_bsr_guarded"  # set on every guarded handler (the tests enumerate them)


def failed_bytes(method: str, exc: BaseException) -> bytes:
    return json.dumps(FailedReply.of(method, exc).to_json(), sort_keys=True).encode()


def handler(method: str) -> Callable[[Handler], Handler]:
    """``server_module_handler(method)``, its exceptions answered as a ``FailedReply``."""

    def decorate(fn: Handler) -> Handler:
        safe = guarded(method, lambda _s, exc, *_a: failed_bytes(method, exc), _guard_of)(fn)
        return server_module_handler(method)(safe)

    return decorate


def _guard_of(module: Any) -> Any:
    return module._guard


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
        raise ValueError(f"{method} is not a mutating method of bsrkv.control_token")

    def decorate(fn: Handler) -> Handler:
        @functools.wraps(fn)
        def guarded_fn(self: Any, payload: bytes) -> bytes:
            refused, body = admit(method, self._control_token, payload)
            return refused if refused is not None else fn(self, body)

        setattr(guarded_fn, GUARDED, method)
        return handler(method)(guarded_fn)

    return decorate
