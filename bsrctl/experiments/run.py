"""The life of every run (ladder, sweep, law, round trip, failure matrix, TempoKV): evidence
opened first (a new run id each time), a point written after each measurement, progress on
stderr, SIGTERM and Ctrl-C turned into an abort (evidence valid, ``complete: false``), the
stack torn down, and summary.md rendered from the evidence whatever happened."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from bsrctl import liblogs
from bsrctl.errors import StackFailed
from bsrctl.evidence import EvidenceWriter, Verdict, merge
from bsrctl.evidence.manifest import write_manifest
from bsrctl.experiments.console import RunConsole, progress
from bsrctl.report import write_summary
from bsrctl.trace.collect import COLLECTOR

Progress = Callable[[str], None]
__all__ = ["Interrupted", "Progress", "RunConsole", "execute", "progress", "sigterm_interrupts"]


class RunCheck(Protocol):
    """A run-level check: evidence's Check, or one that carries more (TempoKV's expectations)."""

    @property
    def verdict(self) -> Verdict: ...

    def to_json(self) -> dict[str, Any]: ...


Body = Callable[[EvidenceWriter], tuple[dict[str, Any], Sequence[RunCheck]]]


class Interrupted(KeyboardInterrupt):
    """The run got SIGTERM (handled like Ctrl-C)."""


class _TermGuard:
    """While armed, the first SIGTERM raises Interrupted; disarmed, signals are ignored (a
    second signal must not cut a teardown short)."""

    def __init__(self) -> None:
        self.armed = True

    def disarm(self) -> None:
        self.armed = False

    def handler(self, signum: int, _frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise Interrupted(f"signal {signal.Signals(signum).name}")


@contextmanager
def sigterm_interrupts() -> Iterator[_TermGuard]:
    """SIGTERM raises Interrupted in the main thread (once); disarm() before teardown so a
    second signal cannot cut a teardown short. No-op outside the main thread."""
    guard = _TermGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    old = signal.signal(signal.SIGTERM, guard.handler)
    try:
        yield guard
    finally:
        signal.signal(signal.SIGTERM, old)


def execute(
    writer: EvidenceWriter, body: Body, teardown: Callable[[], None], say: Progress
) -> Verdict:
    """Run `body`, finish or abort the evidence, always tear down and render summary.md.
    Library logs land in the run folder meanwhile; `say`, a RunConsole, shows each point."""
    console = say if isinstance(say, RunConsole) else None
    if console is not None:
        writer.listeners.append(console.point)
    verdict = Verdict.UNKNOWN
    try:
        # spans arriving meanwhile land in the run folder; timeline.json once torn down
        with COLLECTOR.collecting(writer.run_dir):
            with liblogs.into(writer.run_dir), sigterm_interrupts() as guard:
                try:
                    summary, run_checks = body(writer)
                finally:
                    guard.disarm()
                    teardown()
        summary["checks"] = [c.to_json() for c in run_checks]
        run_verdict = merge(c.verdict for c in run_checks) if run_checks else None
        verdict = writer.finish(summary, run_verdict)
    except BaseException as exc:
        why = (
            "interrupted"
            if isinstance(exc, KeyboardInterrupt)
            else "stack failed"
            if isinstance(exc, StackFailed)
            else "stopped"
        )
        writer.abort(f"{why}: {type(exc).__name__}: {exc}")
        raise
    finally:
        write_summary(writer.run_dir)
        write_manifest(writer.run_dir)
        if console is not None:
            console.finished(verdict, writer.path)
    if console is None:
        say(f"{verdict}: {writer.run_dir}")
    return verdict
