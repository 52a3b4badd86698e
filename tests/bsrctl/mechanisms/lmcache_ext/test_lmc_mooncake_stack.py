"""bsrctl.stack.launch.serving.mooncake: master + storage node in a private network namespace,
by PID."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from bsrctl.errors import StackFailed
from bsrctl.stack.launch.netns import (
    NetNamespace,
    ensure_ready,
    namespace_support,
    nsenter_prefix,
)
from bsrctl.stack.launch.process import pids_alive
from bsrctl.stack.launch.serving.mooncake import mooncake_binaries, start

pytestmark = pytest.mark.mooncake


def test_the_namespace_is_private_with_its_own_loopback(netns):
    # what namespace_support promised, observed in the namespace the stack runs in: only lo,
    # up with 127.0.0.1, and the host's 127.0.0.1 unreachable from inside (a listener here
    # refuses nothing there: nothing is there)
    assert namespace_support().detail == "unshare -n + nsenter work; lo up in a private namespace"
    inside = nsenter_prefix(netns.pid)
    links = subprocess.run([*inside, "ip", "-o", "link", "show"], capture_output=True,
                           text=True, timeout=10, check=True).stdout  # fmt: skip
    assert [line.split(":")[1].strip() for line in links.splitlines()] == ["lo"]
    with socket.create_server(("127.0.0.1", 0)) as host_listener:
        port = host_listener.getsockname()[1]
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"
        res = subprocess.run([*inside, sys.executable, "-c", probe], capture_output=True,
                             text=True, timeout=30)  # fmt: skip
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # open on the host
    assert res.returncode == 1 and "ConnectionRefusedError" in res.stderr, res.stderr


def test_parts_run_inside_the_namespace_only(mooncake, netns):
    bins = mooncake_binaries()
    ns_link = os.readlink(netns.ns_path)
    assert ns_link != os.readlink("/proc/self/ns/net")
    for name, pid in mooncake.pids().items():
        exe = os.readlink(f"/proc/{pid}/exe")  # nsenter exec'd: the PID is the program's
        assert exe == str(bins["mooncake_master" if "master" in name else "mooncake_client"])
        assert os.readlink(f"/proc/{pid}/ns/net") == ns_link
    status = mooncake.status()
    assert status["mooncake-master"]["healthy"] is True
    assert status["mooncake-node"]["healthy"] is True
    assert mooncake.mounted_bytes() == 512 << 20


def test_master_restart_and_stop_by_pid(mooncake):
    old = mooncake.master.pid
    mooncake.stop_master(timeout_s=5.0)
    assert pids_alive([old]) == []
    assert mooncake.master_healthy() is False
    seconds = mooncake.start_master()
    assert seconds < 10.0
    assert mooncake.master.pid != old
    assert mooncake.master_healthy() is True


def test_state_and_adapter_spec_for_the_serving_stack(mooncake):
    state = mooncake.state()
    assert sorted(state["pids"]) == sorted(mooncake.pids().values())
    assert state["endpoints"]["master_address"] == mooncake.endpoints.master_address
    assert state["netns_pid"] == mooncake.netns.pid
    spec = mooncake.l2_adapter_config(load_workers=3)
    assert spec == {
        "type": "plugin",
        "module_path": "bsrkv.lmcache_ext.adapters.mooncake",
        "class_name": "BsrMooncakeL2Adapter",
        "adapter_params": {
            "master_server_address": mooncake.endpoints.master_address,
            "load_workers": 3,
        },
    }
    health = mooncake.health()
    assert set(health) == {"mooncake-master", "mooncake-node"}
    assert all(h["healthy"] for h in health.values())


def test_start_from_a_spec_and_an_attached_namespace(netns, tmp_path):
    class Spec:  # the fields of specs.MooncakeSpec that start() reads
        segment_size_bytes = 64 << 20
        startup_timeout_s = 20.0

    class Holder:  # any handle with a holder .pid, e.g. from a saved stack state
        pid = netns.pid

    stack = start(Spec(), tmp_path, Holder())
    try:
        assert stack.mounted_bytes() == 64 << 20
        assert stack.netns.holder is None  # attached, not owned
        assert (tmp_path / "mooncake-master.log").exists()
    finally:
        pids = list(stack.pids().values())
        stack.stop(5.0)
        stack.netns.stop()  # attached: must leave the holder alone
    assert pids_alive(pids) == []
    assert netns.alive()


def test_a_shared_namespace_is_refused(netns_support):
    with pytest.raises(StackFailed, match="shares bsrctl's own network namespace"):
        ensure_ready(NetNamespace(pid=os.getpid()), timeout_s=0.3)
