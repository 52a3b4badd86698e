"""Device shaping for an L2 tier: each load costs what the spec's device says, not what the
page cache makes it cost.

On these machines an FS tier is served from memory, so staging would be free. The fault
wrapper (``bsrkv.lmcache_ext.faults.adapter``) takes a ``shape`` ({"bandwidth_bytes_s",
"latency_s"}) and withholds each load's result until the device schedule says the device
finished it: one queue, first come first served (the provider's concurrency 1), each op
taking ``latency_s + bytes / bandwidth_bytes_s`` from when the device is free
(``ShapingSchedule.admit``). The real
read still happens (and must be done by then: a result is never released before the inner
adapter's), so a shaped tier is never faster than the real one, only slower.

The schedule is ``bsrkv.tempokv.schedule``'s, the one the simulated staging device and
the live stack's progress estimate run on: pure (no LMCache), tested to the byte and the
second in virtual time.
"""

from __future__ import annotations

# in the pure core, which may not import this package (contract tempokv-no-stack)
from bsrkv.tempokv.schedule import SHAPE_FIELDS, DeviceShape, ShapedOp, ShapingSchedule

__all__ = ["SHAPE_FIELDS", "DeviceShape", "ShapedOp", "ShapingSchedule"]
