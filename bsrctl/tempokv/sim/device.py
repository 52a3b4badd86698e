"""Simulated SSD→fast-tier staging in virtual time: every read on the device, staging or
ordinary (demand), shares one aggregate rate equally (processor sharing; §3.1 "concurrent
operations share an effective aggregate service rate"), and that aggregate falls as more
reads contend (the issue: "a configurable aggregate rate with contention").

Where the two numbers come from (the paper gives two anchors, not a law):
- one op alone: 11 GiB/s (§5's premeasured rate). Figure 1 agrees: 1.23 s − 0.51 s = 0.72 s
  exposed for 8 GiB at lead 0 is 8/11 = 0.727 s, which also bounds any fixed per-op overhead
  to stage-ready to [−0.02, +0.003] s: none is modelled.
- five ops together: Figure 2's −6.02 s cell (0.5 s predecessor, 12 GiB target behind four
  8-GiB ops) puts the target stage-ready at 6.52 s. Flat sharing at 11 GiB/s gives 44/11 =
  4.0 s (margin −3.5 s, and with a 4 s predecessor neither footprint turns late, against
  the paper's text); no constant per-op overhead fits both figures (Figure 1 needs ≈ 0,
  Figure 2 ≈ 0.6 s for one op and ≈ 2.5 s for five). With aggregate(n) = rate/(1+c(n−1)):
  40·(1+4c)/11 + 4/11 = 6.52 gives c = 0.173. The hyperbolic form between the anchors is
  an interpolation, not the paper's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bsrkv.clock import Clock, Timer
from bsrkv.tempokv.kv import GIB
from bsrkv.tempokv.schedule import DeviceShape, ShapingSchedule


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    staging_bytes_s: float = 11.0 * GIB  # one op alone (paper: ≈ 11 GiB/s measured)
    contention: float = 0.173  # aggregate = rate/(1 + contention·(n − 1)), n reads running;
    # from Figure 2's −6.02 s cell (module docstring)
    concurrency: int = 1  # staging ops the provider keeps in flight (issue order)
    retrieval_bytes_s: float = 16.1 * GIB  # fast tier → GPU (calibrated on Figure 1)
    capacity_bytes: int = 100 * GIB
    budget_bytes: int = 50 * GIB  # protected-capacity budget

    def aggregate_bytes_s(self, running: int) -> float:
        """The device schedule's aggregate (``ShapingSchedule.aggregate_bytes_s``)."""
        return self.staging_bytes_s / (1.0 + self.contention * max(0, running - 1))


class SimStagingDevice:
    """``StagingDevice`` in virtual time: the device schedule (``tempokv.schedule``) with
    every op in service at once, no per-op latency, and the contention above; a timer at
    its next end."""

    def __init__(self, clock: Clock, config: DeviceConfig) -> None:
        self.clock = clock
        self.config = config
        shape = DeviceShape(config.staging_bytes_s)
        self.schedule = ShapingSchedule(shape, slots=None, contention=config.contention)
        self._done: dict[int, Callable[[int], None]] = {}
        self._timer: Timer | None = None

    def start(self, op_id: int, size_bytes: int, on_done: Callable[[int], None]) -> None:
        self.schedule.start(op_id, self.clock.now(), size_bytes)
        self._done[op_id] = on_done
        self._arm()

    def remaining_bytes(self, op_id: int) -> int:
        """0 once finished (its completion callback is on its way)."""
        return self.schedule.remaining_bytes(op_id, self.clock.now())

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at_s = self.schedule.next_event_s()
        if at_s is not None:
            self._timer = self.clock.call_at(at_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        callbacks = [
            (op_id, self._done.pop(op_id)) for op_id in self.schedule.advance(self.clock.now())
        ]
        for op_id, on_done in callbacks:
            on_done(op_id)
        self._arm()
