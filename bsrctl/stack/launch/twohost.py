"""Two hosts on one machine: a serving node and a storage node, each its own network namespace
created by the run, joined by one veth pair and nothing else.

    serving node (vLLM + LMCache)  198.18.0.1/30 ── veth ── 198.18.0.2/30  storage node (Mooncake)

Addresses come from 198.18.0.0/15 (RFC 2544, network benchmarks) and live only inside the two
namespaces: the machine's own namespace gets no address and no route, and neither namespace
has a default route, so nothing outside them can be addressed. Each namespace keeps its own
``lo`` (a part that binds 127.0.0.1 stays private to its node). The veth pair is created in
bsrctl's namespace and moved at once; ``stop`` deletes it by name wherever it is, then stops
the holders (a namespace goes with its last process), also after a failed start.
``lose_storage`` destroys the storage node (the failure matrix's storage-node-lost) and
``rebuild_storage`` joins a new one with a new veth pair of the same names and addresses.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bsrctl.errors import StackFailed
from bsrctl.stack.launch.netns import NetNamespace, start_netns

PREFIX_LEN = 30
SERVING_ADDR = "198.18.0.1"
STORAGE_ADDR = "198.18.0.2"
SUBNET = "198.18.0.0/30"
IP_TIMEOUT_S = 10.0


def _ip(args: list[str], ns: NetNamespace | None = None, check: bool = True) -> str:
    argv = ["ip", *args] if ns is None else ns.wrap(["ip", *args])
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise StackFailed(f"{' '.join(argv)} ran over {IP_TIMEOUT_S:g} s") from None
    if check and res.returncode != 0:
        raise StackFailed(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res.stdout


@dataclass
class TwoHosts:
    """The two namespaces and the veth pair between them (what this run created)."""

    serving: NetNamespace
    storage: NetNamespace
    serving_if: str
    storage_if: str
    created: list[str] = field(default_factory=list)  # what exists now, for the cleanup

    @property
    def serving_addr(self) -> str:
        return SERVING_ADDR

    @property
    def storage_addr(self) -> str:
        return STORAGE_ADDR

    def link(self, up: bool) -> None:
        """Set the storage link down (a partition) or up again, on both ends."""
        state = "up" if up else "down"
        _ip(["link", "set", self.serving_if, state], self.serving)
        _ip(["link", "set", self.storage_if, state], self.storage)

    def routes(self) -> dict[str, list[str]]:
        """Each node's routes (main table) and addresses, as `ip -o` prints them."""
        out: dict[str, list[str]] = {}
        for name, ns in (("serving", self.serving), ("storage", self.storage)):
            out[f"{name}.routes"] = _ip(["-o", "route", "show"], ns).splitlines()
            out[f"{name}.addrs"] = [
                " ".join(line.split()[1:4])
                for line in _ip(["-o", "-4", "addr", "show"], ns).splitlines()
            ]
        return out

    def describe(self) -> dict[str, object]:
        return {
            "topology": "two-hosts",
            "serving_node": {"netns_pid": self.serving.pid, "address": SERVING_ADDR,
                             "interface": self.serving_if},
            "storage_node": {"netns_pid": self.storage.pid, "address": STORAGE_ADDR,
                             "interface": self.storage_if},
            "subnet": SUBNET,
        }  # fmt: skip

    def lose_storage(self) -> int:
        """The storage node's namespace destroyed: its holder stopped by PID (the caller
        stopped the processes in it first); the veth pair goes with it. Returns the PID."""
        pid = self.storage.pid
        self.storage.stop()
        if "veth" in self.created:
            self.created.remove("veth")
        return pid

    def rebuild_storage(self, log_dir: Path) -> NetNamespace:
        """A new storage node: a new namespace joined to the serving node by a new veth pair
        of the same names and addresses (the old pair went with the old namespace)."""
        self.storage = start_netns(log_dir, name="netns-storage")
        try:
            _join(self)
        except BaseException:
            self.stop()
            raise
        return self.storage

    def stop(self) -> None:
        """Delete the veth pair (deleting one end deletes both), stop both holders."""
        if "veth" in self.created:
            for ns in (None, self.serving, self.storage):  # wherever it is now
                try:
                    if ns is not None and not ns.alive():
                        continue
                    if _ip(["-o", "link", "show", self.serving_if], ns, check=False):
                        _ip(["link", "del", self.serving_if], ns, check=False)
                        break
                except StackFailed:
                    continue
            self.created.remove("veth")
        for ns in (self.serving, self.storage):
            ns.stop()


def start_two_hosts(log_dir: Path) -> TwoHosts:
    """Both namespaces (lo up in each), the veth pair moved into them, addresses set, links
    up. Everything created is removed again if any step fails."""
    tag = secrets.token_hex(3)
    serving = start_netns(log_dir, name="netns-serving")
    try:
        storage = start_netns(log_dir, name="netns-storage")
    except BaseException:
        serving.stop()
        raise
    hosts = TwoHosts(serving, storage, f"bsr{tag}s", f"bsr{tag}t")
    try:
        _join(hosts)
    except BaseException:
        hosts.stop()
        raise
    return hosts


def _join(hosts: TwoHosts) -> None:
    """The veth pair created here, one end moved into each namespace, addressed and up."""
    _ip(["link", "add", hosts.serving_if, "type", "veth", "peer", "name", hosts.storage_if])
    hosts.created.append("veth")
    _ip(["link", "set", hosts.serving_if, "netns", str(hosts.serving.pid)])
    _ip(["link", "set", hosts.storage_if, "netns", str(hosts.storage.pid)])
    for ns, ifname, addr in (
        (hosts.serving, hosts.serving_if, SERVING_ADDR),
        (hosts.storage, hosts.storage_if, STORAGE_ADDR),
    ):
        _ip(["addr", "add", f"{addr}/{PREFIX_LEN}", "dev", ifname], ns)
        _ip(["link", "set", ifname, "up"], ns)
