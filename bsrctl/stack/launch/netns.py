"""A private network namespace with only `lo`, for parts that bind 0.0.0.0 whatever their flags.

A holder process (`unshare -n sh -c 'ip link set lo up && exec sleep infinity'`) owns it; every
stack process starts under `nsenter -t HOLDER -n` (nsenter execs: the PID is the program's), and
bsrctl's own client calls reach the namespace's loopback from a thread that setns(2)-ed into it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bsrctl.errors import StackFailed
from bsrctl.stack.launch import process
from bsrctl.stack.launch.process import Supervised

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
LOOPBACK = "127.0.0.1"
HOLDER_SCRIPT = "ip link set lo up && exec sleep infinity"
REQUIRED_TOOLS = ("unshare", "nsenter", "ip")


# ---------------------------------------------------------------------------
# can we have namespaces here?
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NamespaceSupport:
    ok: bool  # a private network namespace with a working lo can be made here
    detail: str  # what was checked, or what failed and how to fix it


def namespace_support(timeout_s: float = 5.0) -> NamespaceSupport:
    """Whether ``unshare -n`` works here (root or CAP_SYS_ADMIN, tools present)."""
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if missing:
        return NamespaceSupport(
            False,
            f"missing {', '.join(missing)}: install util-linux and iproute2 "
            "(apt-get install -y util-linux iproute2)",
        )
    try:
        res = subprocess.run(
            ["unshare", "-n", "sh", "-c", "ip link set lo up && ip -o addr show lo"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NamespaceSupport(False, f"unshare -n failed: {exc}")
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip().splitlines()
        return NamespaceSupport(
            False,
            f"unshare -n refused ({why[-1] if why else res.returncode}): run as root or with "
            "CAP_SYS_ADMIN (docker: --cap-add SYS_ADMIN); Mooncake is skipped, never run "
            "unconfined",
        )
    if "127.0.0.1" not in res.stdout:
        return NamespaceSupport(False, "lo came up without 127.0.0.1 in a new namespace")
    return NamespaceSupport(True, "unshare -n + nsenter work; lo up in a private namespace")


# ---------------------------------------------------------------------------
# the namespace
# ---------------------------------------------------------------------------


_libc = ctypes.CDLL(None, use_errno=True)


def nsenter_prefix(pid: int | str) -> list[str]:
    """What enters the network namespace held by ``pid`` (a plan's placeholder for one not
    started yet) before a command: ``nsenter`` execs it, so the PID is the program's."""
    return ["nsenter", "-t", str(pid), "-n", "--"]


class NetNamespace:
    """A private network namespace held by one process; the stack's processes join it.

    Either it owns its holder (``start_netns``) or it attaches to an existing holder's PID
    (``NetNamespace(pid=...)``, e.g. one another bsrctl process started): then ``stop``
    leaves the holder alone.
    """

    def __init__(self, holder: Supervised | None = None, pid: int | None = None) -> None:
        if (holder is None) == (pid is None):
            raise ValueError("give exactly one of holder (owned) or pid (attached)")
        self.holder = holder
        self._attached_pid = pid

    @classmethod
    def of(cls, ns: object) -> NetNamespace:
        """This class for ``ns``: itself, or attached to any object with a holder ``pid``."""
        if isinstance(ns, NetNamespace):
            return ns
        pid = getattr(ns, "pid", None)
        if not isinstance(pid, int):
            raise TypeError(f"not a network namespace handle: {ns!r}")
        return cls(pid=pid)

    @property
    def pid(self) -> int:
        if self._attached_pid is not None:
            return self._attached_pid
        assert self.holder is not None
        if self.holder.pid is None:
            raise StackFailed("network namespace holder not started")
        return self.holder.pid

    @property
    def ns_path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def alive(self) -> bool:
        if self.holder is not None:
            return self.holder.alive()
        return os.path.exists(self.ns_path)

    def wrap(self, argv: list[str]) -> list[str]:
        """Command line that runs argv inside the namespace (nsenter execs: same PID)."""
        return [*nsenter_prefix(self.pid), *argv]

    def call(self, fn: Callable[[], T], timeout_s: float = 30.0) -> T:
        """Run fn in a new thread that has joined the namespace (setns is per thread)."""
        box: dict[str, object] = {}

        def run() -> None:
            try:
                fd = os.open(self.ns_path, os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns({self.ns_path}): {os.strerror(err)}")
                finally:
                    os.close(fd)
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc

        t = threading.Thread(target=run, name="netns-call", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            raise TimeoutError(f"call in network namespace {self.pid} ran over {timeout_s} s")
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]

    def free_port(self) -> int:
        """A port free on the namespace's loopback (bind 0, read it, close)."""

        def pick() -> int:
            with socket.socket() as s:
                s.bind((LOOPBACK, 0))
                return int(s.getsockname()[1])

        return self.call(pick, 5.0)

    def http_get(self, url: str, timeout_s: float = 2.0) -> tuple[int, bytes] | None:
        """(status, body) of a GET inside the namespace; None if nothing answered."""
        return self.call(lambda: process.http_get(url, timeout_s), timeout_s + 5.0)

    def http_ok(self, url: str, timeout_s: float = 2.0) -> bool:
        return self.call(lambda: process.http_ok(url, timeout_s), timeout_s + 5.0)

    def tcp_open(self, port: int, host: str = LOOPBACK, timeout_s: float = 1.0) -> bool:
        return self.call(lambda: process.tcp_open(host, port, timeout_s), timeout_s + 5.0)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the holder if this object owns it (the namespace goes with its last process)."""
        if self.holder is not None:
            self.holder.stop(timeout_s)


def start_netns(log_dir: Path, name: str = "netns", timeout_s: float = 10.0) -> NetNamespace:
    """Start the holder of a private network namespace with lo up."""
    support = namespace_support()
    if not support.ok:
        raise StackFailed(f"no private network namespace: {support.detail}")
    holder = Supervised(
        name=name,
        argv=["unshare", "-n", "sh", "-c", HOLDER_SCRIPT],
        log_path=log_dir / f"{name}.log",
    )
    holder.start()
    ns = NetNamespace(holder=holder)
    try:
        holder.wait_healthy(lambda: _lo_up(ns), timeout_s, interval_s=0.05)
    except BaseException:
        holder.stop(2.0)
        raise
    return ns


def _lo_up(ns: NetNamespace) -> bool:
    """The namespace is private (not ours) and its loopback carries a connection."""
    try:
        if os.readlink(ns.ns_path) == os.readlink("/proc/self/ns/net"):
            return False  # unshare has not run yet: nsenter now would land in our namespace
        return ns.call(_loopback_works, 5.0)
    except (OSError, StackFailed, TimeoutError):
        return False


def _loopback_works() -> bool:
    try:
        with socket.socket() as srv:
            srv.bind((LOOPBACK, 0))
            srv.listen(1)
            with socket.create_connection(srv.getsockname(), timeout=0.5):
                return True
    except OSError:
        return False


def ensure_ready(ns: NetNamespace, timeout_s: float = 10.0) -> None:
    """Wait until ns is a private namespace with lo up; StackFailed (with the fix) if not."""
    if wait_until(lambda: _lo_up(ns), timeout_s):
        return
    if os.path.exists(ns.ns_path) and os.readlink(ns.ns_path) == os.readlink("/proc/self/ns/net"):
        why = f"process {ns.pid} shares bsrctl's own network namespace (not unshared)"
    else:
        why = f"lo is down in the namespace of process {ns.pid}"
    raise StackFailed(
        f"network namespace not ready after {timeout_s:.0f} s: {why}; start the holder with "
        f"unshare -n sh -c '{HOLDER_SCRIPT}' (bsrctl.stack.launch.netns.start_netns)"
    )


def wait_until(probe: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(interval_s)
    return probe()


@contextmanager
def maybe_inside(ns: NetNamespace | None) -> Iterator[None]:
    """Run this thread's code inside ns (when given), then return to where it was."""
    if ns is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(ns.ns_path, os.O_RDONLY)
    try:
        _setns(target, ns.ns_path)
        try:
            yield
        finally:
            _setns(own, "own namespace")
    finally:
        os.close(target)
        os.close(own)


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({what}): {os.strerror(err)}")
