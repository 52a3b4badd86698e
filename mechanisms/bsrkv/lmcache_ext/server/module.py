"""``BsrServerModule``: the lookup, retrieve and control handlers on one engine module,
with TempoKV composed in as a component (``hooks.TempoKVHooks``).

LMCache discovers a module's handlers on its class (inherited ones included), so the
module is the composition of the handler mixins over their shared ``ModuleState``; TempoKV
is not one of them: the factory builds its component and gives it to the module, whose
handlers call its hooks explicitly and whose ``tempokv.*`` methods delegate to it.
"""

from __future__ import annotations

import faulthandler
import os
import signal
from collections.abc import Callable
from typing import Any

from bsrkv.hostsurface import require

# before LMCache's names are imported: one missing is refused in one line naming it
require("bsrkv.lmcache_ext", ("lmcache",))

from lmcache.v1.multiprocess.ext_server_module import ExtServerModuleBuildContext  # noqa: E402

from bsrkv.lmcache_ext.server.control import ControlHandlers  # noqa: E402
from bsrkv.lmcache_ext.server.guard import handler, mutating  # noqa: E402
from bsrkv.lmcache_ext.server.hooks import TempoKVHooks  # noqa: E402
from bsrkv.lmcache_ext.server.lookup import LookupHandlers  # noqa: E402
from bsrkv.lmcache_ext.server.retrieve import RetrieveHandlers  # noqa: E402
from bsrkv.lmcache_ext.tempokv.component import TempoKVComponent  # noqa: E402
from bsrkv.tempokv import wire  # noqa: E402
from bsrkv.trace.spans import shutdown_server_tracer  # noqa: E402

# builds a module's TempoKV component from the module (its ServerSide)
TempoKVFactory = Callable[["BsrServerModule"], TempoKVHooks]


class BsrServerModule(LookupHandlers, RetrieveHandlers, ControlHandlers):
    """The engine module: replaces the lookup/retrieve handlers, adds the bsr.* methods and
    the tempokv.* methods of the TempoKV component it is given (none: ``NO_TEMPOKV``)."""

    def __init__(
        self, build_ctx: ExtServerModuleBuildContext, tempokv: TempoKVFactory | None = None
    ) -> None:
        super().__init__(build_ctx)
        if tempokv is not None:
            self.tempokv = tempokv(self)

    @property
    def context(self) -> Any:
        return self._ctx

    @mutating(wire.CONFIGURE)
    def tempokv_configure(self, payload: bytes) -> bytes:
        return self.tempokv.configure(payload)

    @handler(wire.STATUS)
    def tempokv_status(self, payload: bytes) -> bytes:
        return self.tempokv.status()

    @mutating(wire.UPDATE)
    def tempokv_update(self, payload: bytes) -> bytes:
        return self.tempokv.update(payload)

    def report_status(self) -> dict[str, Any]:
        """Merged into the server's ``/status``: never breaks that page."""
        fallback = {"bsr": {"error": "bsr.status failed (counted: guard_report_status)"}}
        return self._guard.run("report_status", fallback, lambda: {"bsr": self.status().to_json()})

    def close(self) -> None:
        """Each part stopped under the guard: one that fails stops none of the others, and
        nothing reaches LMCache's shutdown."""
        g = self._guard
        g.call("close_tempokv", self.tempokv.close)
        g.call("close_stall", self._stall.stop)
        g.call("close_probe", self._probe_pool.shutdown, wait=False, cancel_futures=True)
        # the spans still queued, then the exporter's last spans, before the process goes
        g.call("close_trace", self._trace_pool.shutdown, wait=True)
        shutdown_server_tracer()


def build_server_modules(ctx: ExtServerModuleBuildContext) -> BsrServerModule:
    """Factory named by ``--server-module`` (``factory_name`` defaults to this): the module
    with TempoKV's component (off until ``tempokv.configure``).

    With ``BSRKV_DUMP_STACKS=1`` in the server's environment, SIGUSR1 dumps every
    thread's stack to stderr (diagnosing a stalled server without a debugger).
    """
    if os.environ.get("BSRKV_DUMP_STACKS") == "1":
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    return BsrServerModule(ctx, tempokv=TempoKVComponent)
