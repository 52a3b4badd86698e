"""Reference vLLMs kept for more than one run: a pool folder (``BSRCTL_REFERENCE_POOL``) holds
at most ``POOL_SIZE`` of them, one per launch (its argv and environment, ports and folders
left out), each started by the first run that misses the canonical cache on it and stopped by
``close_pool`` by PID, as ``bsrctl stack down`` stops a stack. Without the variable every run
that misses starts and stops its own reference (``canonical.canonical_references``).

Why a pool: the reference's numbers depend only on its launch (no connector, no prefix
cache, greedy: CPU stack facts), and a vLLM start is ~30 s of interpreter imports on 2 cores.
The test suite sets the variable for its session (tests/conftest.py); a nightly job that
runs many specs on one node can too.

One run at a time per reference: a run holds the entry's flock while it sends its prompts,
one after another, so a canonical output is never computed batched beside another's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bsrctl.specs import StackSpec
from bsrctl.stack.launch.process import http_ok
from bsrctl.stack.launch.serving.commands import reference_launch
from bsrctl.stack.launch.serving.state import start_times, stop_from_state

POOL_ENV = "BSRCTL_REFERENCE_POOL"
POOL_SIZE = 3  # ~2 GB resident each (tiny model, 1 GiB KV space): beside two stacks in 24 GiB


def pool_dir() -> Path | None:
    """The pool folder the environment names, else None (no pool)."""
    raw = os.environ.get(POOL_ENV)
    return Path(raw) if raw else None


def launch_key(spec: StackSpec, model_dir: Path) -> str:
    """What makes two references the same process: the launch with its port and its
    folders replaced by placeholders (the model folder is named by its content's hash)."""
    launch = reference_launch(spec, model_dir, "<port>", Path("<dir>"))
    doc = json.dumps({"argv": launch.argv, "env": sorted(launch.env.items())})
    return hashlib.sha256(doc.encode()).hexdigest()[:20]


def _alive(stack_dir: Path) -> int | None:
    """The port of the entry's reference when its vLLM is the process it recorded (same PID,
    same start time) and answers /health; else None."""
    path = stack_dir / "state.json"
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    part = state.get("parts", {}).get("vllm")
    port = state.get("ports", {}).get("vllm.port")
    if not part or not port:
        return None
    known = {int(k): v for k, v in state.get("pid_start_times", {}).items()}
    if start_times([part["pid"]]).get(part["pid"]) != known.get(part["pid"]):
        return None
    return port if http_ok(f"http://127.0.0.1:{port}/health") else None


@contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing drops the lock


def entries(pool: Path) -> list[Path]:
    """The pool's entry folders, least recently used first."""
    if not pool.is_dir():
        return []
    found = [p for p in pool.iterdir() if p.is_dir() and (p / "used").exists()]
    return sorted(found, key=lambda p: (p / "used").stat().st_mtime)


def _evict(pool: Path, keep: str) -> None:
    """Stop the least recently used idle references until one more fits."""
    live = [p for p in entries(pool) if p.name != keep and _alive(p / "stack") is not None]
    over = len(live) - POOL_SIZE + 1
    for entry in live:
        if over <= 0:
            return
        with _locked(pool / f"{entry.name}.lock", blocking=False) as got:
            if got:  # one in use by another run stays
                stop_from_state(entry / "stack" / "state.json")
                over -= 1


@contextmanager
def held(pool: Path, key: str) -> Iterator[tuple[Path, int | None]]:
    """The entry of ``key``, locked for this run: its folder and the port of its running
    reference, or None (start one in ``<entry>/stack``: the pool keeps it). A dead one's
    leftovers are stopped by PID first, and the least recently used make room."""
    pool.mkdir(parents=True, exist_ok=True)
    entry = pool / key
    with _locked(pool / f"{key}.lock"):
        port = _alive(entry / "stack")
        if port is None:
            if (entry / "stack" / "state.json").is_file():
                stop_from_state(entry / "stack" / "state.json")
            _evict(pool, key)
        entry.mkdir(exist_ok=True)
        (entry / "used").touch()
        yield entry, port


def close_pool(pool: Path) -> list[int]:
    """Stop every reference of the pool by PID; the PIDs still alive after it."""
    left: list[int] = []
    for entry in entries(pool):
        state = entry / "stack" / "state.json"
        if state.is_file():
            with _locked(pool / f"{entry.name}.lock"):
                left += stop_from_state(state)
    return left


__all__ = ["POOL_ENV", "POOL_SIZE", "close_pool", "entries", "held", "launch_key", "pool_dir"]
