"""A private network namespace with only `lo`, for parts that bind 0.0.0.0 whatever their flags.

A holder process (`unshare -n sleep`) owns the namespace; every stack process starts under
`nsenter -t HOLDER -n`, and bsrctl's own client calls enter it per thread with setns(2).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bsrctl.errors import StackFailed
from bsrctl.stack.process import Supervised

CLONE_NEWNET = 0x40000000


def namespaces_allowed() -> tuple[bool, str]:
    """Whether this user may create a private network namespace, and why not."""
    try:
        res = subprocess.run(
            ["unshare", "-n", "--", "ip", "link", "set", "lo", "up"],
            capture_output=True,
            timeout=10,
            text=True,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare/ip unavailable: {exc}"
    if res.returncode != 0:
        return False, (res.stderr.strip() or f"unshare exited {res.returncode}")
    return True, "ok"


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class NetNs:
    """The holder process and helpers to run or call inside its namespace."""

    def __init__(self, log_dir: Path, holder_pid: int | None = None) -> None:
        self.holder = Supervised(
            name="netns-holder",
            argv=["unshare", "-n", "--", "sleep", "infinity"],
            log_path=log_dir / "netns-holder.log",
        )
        self._attached_pid = holder_pid  # an existing namespace (bsrctl stack status/down)

    @property
    def pid(self) -> int:
        pid = self._attached_pid or self.holder.pid
        if pid is None:
            raise StackFailed("network namespace not started")
        return pid

    def start(self) -> None:
        ok, why = namespaces_allowed()
        if not ok:
            raise StackFailed(
                f"private network namespaces are not allowed here ({why}); Mooncake needs one "
                f"because some of its listeners bind 0.0.0.0: run as root, or disable "
                f"stack.mooncake.enabled"
            )
        self.holder.start()
        res = subprocess.run(
            [*self.prefix(), "ip", "link", "set", "lo", "up"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if res.returncode != 0:
            self.holder.stop()
            raise StackFailed(f"cannot bring lo up in the namespace: {res.stderr.strip()}")

    def prefix(self) -> list[str]:
        """argv prefix that runs a command inside the namespace."""
        return ["nsenter", "-t", str(self.pid), "-n", "--"]

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Run this thread's code inside the namespace, then return to where it was."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/proc/{self.pid}/ns/net", os.O_RDONLY)
        try:
            _setns(target)
            try:
                yield
            finally:
                _setns(own)
        finally:
            os.close(target)
            os.close(own)

    def stop(self) -> None:
        self.holder.stop(timeout_s=5)


@contextmanager
def maybe_inside(ns: NetNs | None) -> Iterator[None]:
    if ns is None:
        yield
    else:
        with ns.inside():
            yield
