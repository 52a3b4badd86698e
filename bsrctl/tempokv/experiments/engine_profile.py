"""Where vLLM's engine loop spends its samples: py-spy attached to a deployment's EngineCore
for the cells of a bench (``py-spy record --nonblocking --format raw``), read back as
shares of the samples (the adapter's own frames, the top functions by self samples).

py-spy is a tool, not a dependency: without it on PATH (or beside the interpreter) the
bench says so and profiles nothing. Each recorder is a child started here and stopped by
its PID (SIGINT writes its file, SIGKILL after a timeout)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

ENGINE_TITLE = "EngineCore"  # vLLM's process title of the engine core (set_process_title)


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def engine_core_pid(vllm_pid: int) -> int | None:
    """The EngineCore among the API server's descendants (its title names it)."""
    try:
        kids = psutil.Process(vllm_pid).children(recursive=True)
    except psutil.Error:
        return None
    for k in kids:
        try:
            if ENGINE_TITLE in " ".join(k.cmdline()) or ENGINE_TITLE in k.name():
                return k.pid
        except psutil.Error:
            continue
    return None


class Recorder:
    """``py-spy record`` of one process until ``stop``."""

    def __init__(self, exe: str, pid: int, out: Path, rate: int = 250) -> None:
        self.out = out
        argv = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                "--format", "raw", "--output", str(out)]  # fmt: skip
        self._log = out.with_suffix(".log").open("w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def stop(self, timeout_s: float = 20.0) -> Path | None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._log.close()
        return self.out if self.out.exists() else None


@dataclass(frozen=True)
class ProfileSummary:
    samples: int
    adapter_share: float  # samples with any frame of the mechanisms (bsrkv) on the stack
    top_self: tuple[tuple[str, float], ...]  # (function, share of samples as the leaf)
    top_total: tuple[tuple[str, float], ...]  # (function, share of samples on the stack)


def _frames(stack: str) -> list[str]:
    return [f for f in stack.split(";") if f]


def summarize(raw: Path, top: int = 15) -> ProfileSummary:
    """A py-spy raw (collapsed) file: ``frame;frame;... count`` per line, root first."""
    leaf: Counter[str] = Counter()
    total: Counter[str] = Counter()
    n = ours = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = _frames(stack)
        n += c
        ours += c * any("bsrkv/" in f for f in frames)
        if frames:
            leaf[frames[-1]] += c
        for f in set(frames):
            total[f] += c
    share = (lambda x: x / n) if n else (lambda x: 0.0)  # noqa: E731
    return ProfileSummary(
        n,
        share(ours),
        tuple((f, round(share(c), 4)) for f, c in leaf.most_common(top)),
        tuple((f, round(share(c), 4)) for f, c in total.most_common(top)),
    )
