"""What a run shows on the console, and nothing else does (library logs go to files:
``bsrctl.liblogs``).

- ``rich`` (default): on a terminal, a live progress line on stderr: point i of n, the
  phase (deploy, seed, forget, restore, check), bytes restored so far, elapsed time and ETA;
  elsewhere (CI logs) each phase as a line. Then one line per point with its verdict.
- ``quiet``: the per-point lines and the run's result only.
- ``json``: nothing; the CLI prints the evidence path and the verdict as JSON.

A ``RunConsole`` is the ``Progress`` callable the experiments already take (``say(msg)``),
with ``expect(n)`` for the number of points and ``point(doc)`` called by ``execute`` for
each point written.
"""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bsrctl import unexpected
from bsrctl.evidence import Verdict
from bsrctl.evidence.verdict import EXCEEDS, shown_verdict

MIB = 1 << 20
# EXCEEDS (a rung past L1 by the capacity law) in blue: an answer, neither green nor red
COLOUR = {"PASS": "green", "FAIL": "red", "UNKNOWN": "yellow", EXCEEDS: "blue"}


class Mode(StrEnum):
    RICH = "rich"
    QUIET = "quiet"
    JSON = "json"


_mode = Mode.RICH
_last: tuple[Verdict, Path] | None = None


def configure(mode: Mode) -> None:
    """The CLI's choice for the runs of this process (``--quiet``, ``--json``)."""
    global _mode, _last
    _mode, _last = mode, None


def last_run() -> tuple[Verdict, Path] | None:
    """(verdict, evidence.json) of the last run this process finished or aborted."""
    return _last


def _fmt_s(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def point_line(doc: dict[str, Any]) -> str:
    """The few figures of a point that matter, in units people read."""
    m = doc.get("measures", {})
    bits: list[str] = []
    peak, bound = m.get("restore_pool_peak_bytes"), m.get("rws_bound_bytes")
    if peak is not None:
        bits.append(
            f"peak {peak / MIB:.2f} MiB" + (f" (W·c+aux {bound / MIB:.2f})" if bound else "")
        )
    cached, expected = m.get("cached_tokens"), m.get("expected_cached_tokens")
    if cached is not None:
        bits.append(f"cached {cached}" + (f"/{expected}" if expected is not None else "") + " tok")
    for key, label in (("ttft_s", "TTFT"), ("restore_s", "restore"), ("time_to_fallback_s",
                                                                     "fallback")):  # fmt: skip
        if m.get(key) is not None:
            bits.append(f"{label} {m[key] * 1000:.1f} ms")
    if shown_verdict(doc) == EXCEEDS:  # its checks do not pass by the law: say why instead
        plan = doc.get("whole_plan_bytes") or 0
        l1 = (doc.get("params") or {}).get("l1_capacity_bytes") or 0
        bits.append(f"whole plan {plan / MIB:.2f} MiB > L1 {l1 / MIB:.2f} MiB (capacity law)")
        return " · ".join(bits)
    bad = [c["name"] for c in doc.get("checks", []) if c.get("verdict") != "PASS"]
    if bad:
        bits.append("not passing: " + ", ".join(bad))
    return " · ".join(bits)


class RunConsole:
    """The console of one run (see the module doc)."""

    def __init__(self, mode: Mode, err: Console | None = None) -> None:
        self.mode = mode
        self.err = err or Console(stderr=True, highlight=False, soft_wrap=True)
        self.total: int | None = None
        self.done = 0
        self.moved = 0
        self.label = self.base = ""
        self.t0 = time.monotonic()
        self.first: float | None = None  # when the first point was written
        self.live: Progress | None = None
        self.task: TaskID | None = None

    # ---- what the experiments call ----

    def __call__(self, msg: str) -> None:
        """A phase or a status message."""
        self.phase(msg)

    def phase(self, msg: str) -> None:
        unexpected.note(msg)
        self.label = self.base = msg
        if self.mode is not Mode.RICH:
            return
        if self._live() is None:
            self.err.print(f"· {msg}", markup=False)
        else:
            self._update()

    def step(self, name: str) -> None:
        """A step inside the current phase (seed, forget, restore, check): live line only."""
        unexpected.note(f"{self.base} · {name}")
        if self.live is not None:
            self.label = f"{self.base} · {name}"
            self._update()

    def watch(self, target: object) -> None:
        """Show the steps of a target that reports them (``on_phase``)."""
        if hasattr(target, "on_phase"):
            target.on_phase = self.step

    def expect(self, total: int) -> None:
        """How many points the run will write (for i of n and the ETA)."""
        self.total = total
        if self.live is not None and self.task is not None:
            self.live.update(self.task, total=total)

    def result(self, msg: str) -> None:
        """A run-level result line (stdout), kept in quiet mode."""
        if self.mode is not Mode.JSON:
            print(msg, flush=True)

    # ---- what execute calls ----

    def point(self, doc: dict[str, Any]) -> None:
        self.done += 1
        self.moved += int(doc.get("measures", {}).get("bytes_restored") or 0)
        if self.mode is Mode.JSON:
            return
        of = f"/{self.total}" if self.total else ""
        now = time.monotonic()
        elapsed = now - self.t0
        if self.first is None:
            self.first = now
        eta = ""
        if self.total and self.done < self.total:
            # after the first point, the pace of points alone (setup is not repeated)
            per = (now - self.first) / (self.done - 1) if self.done > 1 else elapsed
            eta = f", ETA {_fmt_s(per * (self.total - self.done))}"
        v = shown_verdict(doc)
        line = (
            f"[{self.done}{of}] {doc.get('id')} [{COLOUR.get(v, 'white')}]{v}[/] "
            f"{point_line(doc)} ({_fmt_s(elapsed)}{eta})"
        )
        (self.live.console if self.live else self.err).print(line, highlight=False)
        self._update()

    def finished(self, verdict: Verdict, evidence: Path) -> None:
        global _last
        _last = (verdict, evidence)
        unexpected.note_run(evidence.parent)
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    # ---- the live line (terminal only) ----

    def _live(self) -> Progress | None:
        if self.live is None and self.mode is Mode.RICH and self.err.is_terminal:
            self.live = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[moved]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.err,
                transient=True,
            )
            self.task = self.live.add_task("", total=self.total, moved="")
            self.live.start()
        return self.live

    def _update(self) -> None:
        if self.live is None or self.task is None:
            return
        self.live.update(
            self.task,
            description=self.label,
            completed=self.done,
            total=self.total,
            moved=f"{self.moved / MIB:.1f} MiB restored",
        )


def progress(quiet: bool) -> RunConsole:
    """The console of a run: quiet as asked, or as the CLI configured (``--json``)."""
    mode = _mode if _mode is Mode.JSON else (Mode.QUIET if quiet else _mode)
    return RunConsole(mode)
