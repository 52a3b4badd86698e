"""The two-host topology alone (no stack): what it creates, and that it removes all of it,
also when a step fails half way. Starts namespace holders: marked mooncake."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from bsrctl.errors import StackFailed
from bsrctl.stack.launch import twohost
from bsrctl.stack.launch.netns import namespace_support
from bsrctl.stack.launch.process import pids_alive

pytestmark = pytest.mark.mooncake


def listener(addr: str) -> socket.socket:
    s = socket.socket()
    s.bind((addr, 0))
    s.listen(4)
    return s


def connects(addr: str, port: int) -> str:
    """'' when a TCP connection opens within 2 s, else the error."""
    try:
        with socket.create_connection((addr, port), timeout=2.0):
            return ""
    except OSError as exc:
        return str(exc).lower()


def host(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(autouse=True)
def _needs_namespaces() -> None:
    if not namespace_support().ok:
        pytest.skip(namespace_support().detail)


def test_two_nodes_reach_each_other_only_over_the_veth(tmp_path: Path) -> None:
    links = host("-o", "link", "show")
    hosts = twohost.start_two_hosts(tmp_path)
    try:
        r = hosts.routes()
        assert r["serving.routes"] == [
            f"198.18.0.0/30 dev {hosts.serving_if} proto kernel scope link src 198.18.0.1 "
        ]
        assert r["storage.addrs"] == [
            "lo inet 127.0.0.1/8",
            f"{hosts.storage_if} inet 198.18.0.2/30",
        ]
        srv = hosts.storage.call(lambda: listener("198.18.0.2"))
        port = srv.getsockname()[1]
        try:
            assert hosts.serving.call(lambda: connects("198.18.0.2", port)) == ""
            # no route anywhere else (198.19.0.1 is in the range, on no link): refused locally
            assert "unreachable" in hosts.serving.call(lambda: connects("198.19.0.1", port))
            hosts.link(up=False)
            assert hosts.serving.call(lambda: connects("198.18.0.2", port)) != ""
            hosts.link(up=True)
            assert hosts.serving.call(lambda: connects("198.18.0.2", port)) == ""
        finally:
            srv.close()
        assert "198.18." not in host("-o", "addr", "show")
    finally:
        hosts.stop()
    assert pids_alive([hosts.serving.pid, hosts.storage.pid]) == []
    assert host("-o", "link", "show") == links


def test_a_failed_step_removes_what_was_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    links = host("-o", "link", "show")
    real = twohost._ip
    made: list[twohost.NetNamespace] = []
    real_start = twohost.start_netns

    def start(log_dir: Path, name: str = "netns") -> twohost.NetNamespace:
        made.append(real_start(log_dir, name=name))
        return made[-1]

    def failing(args: list[str], ns: object = None, check: bool = True) -> str:
        if args[:2] == ["addr", "add"]:
            raise StackFailed("injected: addr add refused")
        return real(args, ns, check)  # type: ignore[arg-type]

    monkeypatch.setattr(twohost, "_ip", failing)
    monkeypatch.setattr(twohost, "start_netns", start)
    with pytest.raises(StackFailed, match="injected"):
        twohost.start_two_hosts(tmp_path)
    assert len(made) == 2 and pids_alive([ns.pid for ns in made]) == []
    assert host("-o", "link", "show") == links
