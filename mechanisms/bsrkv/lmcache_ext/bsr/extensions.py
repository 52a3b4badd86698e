"""Control extensions: ``bsr.*`` methods answered by code the server module does not import.

A component loaded into the same LMCache server process (the fault-injecting L2 adapter)
registers its handler here when it is imported; the server module's handler of that
method dispatches through this registry. So production code never imports test machinery,
and a method with nothing registered answers ``{"ok": false, ...}``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

ControlHandler = Callable[[bytes], bytes]  # JSON bytes in, JSON bytes out; never raises

_lock = threading.Lock()
_handlers: dict[str, ControlHandler] = {}


def register_control(method: str, handler: ControlHandler) -> None:
    """Answer ``method`` with ``handler`` in this process (the latest registration wins)."""
    with _lock:
        _handlers[method] = handler


def control_handler(method: str) -> ControlHandler | None:
    with _lock:
        return _handlers.get(method)
