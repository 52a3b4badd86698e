"""Mooncake store (master + one storage node) inside a private network namespace.

Some Mooncake listeners bind 0.0.0.0 whatever the flags, so nothing of it runs in the
machine's own network namespace. One namespace, with nothing but ``lo``, holds the whole
stack: a holder process (``unshare -n sh -c 'ip link set lo up && exec sleep infinity'``)
owns it, and every process of the stack is started with ``nsenter -t <holder> -n --``
(``NetNamespace.wrap``), which execs the program in place, so the PID we hold is the
program's. The LMCache server that uses ``bsrkv.lmcache_ext.adapters.mooncake`` must be
started the same way, and so must vLLM if it talks to that server: one namespace per stack.

bsrctl itself stays in the host namespace and reaches the namespace's loopback through
``NetNamespace.call`` (a fresh thread that ``setns``-es into it, then runs a function:
HTTP probes, port picking, client sockets).

Every process: its command line, PID, log file, a bounded health wait, stop by PID with its
children (SIGTERM, then SIGKILL after a timeout), through
``bsrctl.stack.launch.process.Supervised``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bsrctl.errors import StackFailed
from bsrctl.stack.launch.extensions import MOONCAKE_ADAPTER_MODULE
from bsrctl.stack.launch.netns import LOOPBACK, NetNamespace, ensure_ready
from bsrctl.stack.launch.process import Supervised
from bsrctl.stack.launch.serving.commands import Launch, Port

# ---------------------------------------------------------------------------
# Mooncake master + storage node
# ---------------------------------------------------------------------------


BINARIES = ("mooncake_master", "mooncake_client")  # shipped inside the mooncake wheel


def mooncake_dir() -> Path | None:
    """The installed mooncake package's folder (its binaries live there), found without
    importing it (a plan runs where the wheel's native libraries cannot load); None if
    not installed."""
    import importlib.util

    found = importlib.util.find_spec("mooncake")
    if found is None or found.origin is None:
        return None
    return Path(found.origin).parent


def mooncake_binaries() -> dict[str, Path]:
    """``mooncake_master`` and ``mooncake_client`` shipped inside the mooncake wheel."""
    try:
        import mooncake  # noqa: F401  (the wheel loads: its native libraries are there)
    except ImportError as exc:
        raise StackFailed(
            "the mooncake package is not installed: pip install "
            "'mooncake-transfer-engine-non-cuda==0.3.13.post1' (and apt-get install -y "
            f"libibverbs1): {exc}"
        ) from None
    root = mooncake_dir()
    assert root is not None
    found = {name: root / name for name in BINARIES}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise StackFailed(f"Mooncake binaries missing or not executable: {missing}")
    return found


@dataclass(frozen=True)
class Transport:
    """How the store moves bytes (``stack.mooncake.protocol``, ``rdma_devices``): the storage
    node's ``--protocol``/``--device_names`` and the LMCache client's ``protocol``/
    ``rdma_devices`` (``MooncakeDistributedStore.setup``), one comma-joined list for both
    (mooncake-store/src/real_client_main.cpp: FLAGS_device_names is setup's rdma_devices)."""

    protocol: str = "tcp"
    rdma_devices: tuple[str, ...] = ()

    @property
    def device_names(self) -> str:
        return ",".join(self.rdma_devices)

    @classmethod
    def of(cls, spec: object) -> Transport:
        """From ``specs.MooncakeSpec`` (or anything with those fields)."""
        devices = tuple(getattr(spec, "rdma_devices", ()) or ())
        return cls(str(getattr(spec, "protocol", "tcp")), devices)


@dataclass(frozen=True)
class MooncakeEndpoints:
    rpc_port: Port  # master RPC, clients' master_server_address
    metrics_port: Port  # master HTTP: /health, /metrics
    node_port: Port  # storage node's transfer-engine port (a placeholder in a plan)
    host: str = LOOPBACK  # the storage node's address (its veth end on two hosts)

    @property
    def master_address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def health_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/health"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"


def master_argv(binary: Path, ep: MooncakeEndpoints) -> list[str]:
    return [
        str(binary),
        f"--rpc_address={ep.host}",
        f"--rpc_port={ep.rpc_port}",
        f"--metrics_host={ep.host}",
        f"--metrics_port={ep.metrics_port}",
        "--enable_http_metadata_server=false",
    ]


def node_argv(
    binary: Path, ep: MooncakeEndpoints, segment_size: str, transport: Transport = Transport()
) -> list[str]:
    argv = [
        str(binary),
        f"--host={ep.host}",
        f"--port={ep.node_port}",
        f"--global_segment_size={segment_size}",
        "--local_buffer_size=0",
        f"--protocol={transport.protocol}",
    ]
    if transport.rdma_devices:  # none: Mooncake discovers the RDMA devices itself
        argv.append(f"--device_names={transport.device_names}")
    return [
        *argv,
        f"--master_server_address={ep.master_address}",
        "--metadata_server=P2PHANDSHAKE",
    ]


def mooncake_launches(
    bins: dict[str, Path],
    ep: MooncakeEndpoints,
    segment_size: str,
    transport: Transport,
    prefix: tuple[str, ...],
) -> tuple[Launch, Launch]:
    """The master and the storage node as started, inside the namespace ``prefix`` enters
    (nothing of Mooncake runs in the machine's own: some listeners bind 0.0.0.0)."""
    master = master_argv(bins["mooncake_master"], ep)
    node = node_argv(bins["mooncake_client"], ep, segment_size, transport)
    return (
        Launch("mooncake-master", (*prefix, *master), {}),
        Launch("mooncake-node", (*prefix, *node), {}),
    )


def adapter_params(ep: MooncakeEndpoints, transport: Transport) -> dict[str, object]:
    """The ``bsr_mooncake`` adapter's parameters that name this store. Over RDMA also the
    protocol, the devices and ``register_l1``: the client reads into L1's region, which RDMA
    can only write once it is registered with the transfer engine."""
    params: dict[str, object] = {"master_server_address": ep.master_address}
    if transport.protocol != "tcp":  # tcp is the adapter's default: the CPU argv unchanged
        params.update(
            protocol=transport.protocol,
            rdma_devices=transport.device_names,
            register_l1=transport.protocol == "rdma",
        )
    return params


class MooncakeStack:
    """A Mooncake master and one storage node in ``netns``; owns neither namespace nor ports."""

    def __init__(
        self,
        netns: NetNamespace,
        endpoints: MooncakeEndpoints,
        log_dir: Path,
        segment_size: str = "1GB",
        health_timeout_s: float = 20.0,
        transport: Transport = Transport(),
    ) -> None:
        self.netns = netns
        self.endpoints = endpoints
        self.segment_size = segment_size
        self.health_timeout_s = health_timeout_s
        self.transport = transport
        self._bins = mooncake_binaries()
        self._log_dir = log_dir
        self.master = self._new_master()
        self.node = self._new_node()

    def _launches(self) -> tuple[Launch, Launch]:
        prefix = tuple(self.netns.wrap([]))
        return mooncake_launches(
            self._bins, self.endpoints, self.segment_size, self.transport, prefix
        )

    def _new_master(self) -> Supervised:
        launch = self._launches()[0]
        return Supervised(launch.name, list(launch.argv), self._log_dir / f"{launch.name}.log")

    def _new_node(self) -> Supervised:
        launch = self._launches()[1]
        return Supervised(launch.name, list(launch.argv), self._log_dir / f"{launch.name}.log")

    # ---- lifecycle -----------------------------------------------------

    def start(self) -> MooncakeStack:
        try:
            self.start_master()
            self.start_node()
        except BaseException:
            self.stop(timeout_s=5.0)
            raise
        return self

    def start_master(self) -> float:
        """Start (or restart) the master; seconds until /health answered. Data is empty."""
        if self.master.proc is not None:
            self.master.stop()
            self.master = self._new_master()
        self.master.start()
        return self.master.wait_healthy(self.master_healthy, self.health_timeout_s, 0.05)

    def start_node(self) -> float:
        """Start (or restart) the storage node; seconds until its segment is mounted."""
        if self.node.proc is not None:
            self.node.stop()
            self.node = self._new_node()
        self.node.start()
        return self.node.wait_healthy(self.node_healthy, self.health_timeout_s, 0.1)

    def stop_master(self, timeout_s: float = 10.0) -> None:
        self.master.stop(timeout_s)

    def stop_node(self, timeout_s: float = 10.0) -> None:
        self.node.stop(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Node first (it talks to the master), then the master. The namespace stays."""
        self.node.stop(timeout_s)
        self.master.stop(timeout_s)

    # ---- health --------------------------------------------------------

    def master_healthy(self) -> bool:
        res = self.netns.http_get(self.endpoints.health_url, 1.0)
        return res is not None and res[0] == 200 and b'"ok"' in res[1]

    def node_healthy(self) -> bool:
        """The node's port listens and the master reports a mounted segment."""
        if not self.netns.tcp_open(self.endpoints.node_port, self.endpoints.host):
            return False
        return self.mounted_bytes() > 0

    def mounted_bytes(self) -> int:
        """Bytes of segment capacity the master has mounted (0 if unknown)."""
        res = self.netns.http_get(self.endpoints.metrics_url, 1.0)
        if res is None or res[0] != 200:
            return 0
        return _metric_sum(res[1].decode(errors="replace"), "master_total_capacity_bytes")

    def pids(self) -> dict[str, int | None]:
        return {"mooncake-master": self.master.pid, "mooncake-node": self.node.pid}

    def l2_adapter_config(self, **extra: object) -> dict:
        """The ``--l2-adapter`` JSON (as a dict) that puts this store under LMCache."""
        return {
            "type": "plugin",
            "module_path": MOONCAKE_ADAPTER_MODULE,
            "class_name": "BsrMooncakeL2Adapter",
            "adapter_params": {
                **adapter_params(self.endpoints, self.transport),
                **extra,
            },
        }

    def health(self) -> dict[str, dict]:
        """Per part: pid, alive, healthy, endpoint, log (the serving stack's status shape)."""
        full = self.status()
        keys = ("pid", "alive", "healthy", "endpoint", "log")
        return {name: {k: full[name][k] for k in keys} for name in self.pids()}

    def state(self) -> dict:
        """What ``bsrctl stack status|down`` needs from another process: PIDs, ports, logs."""
        return {
            "pids": [p for p in self.pids().values() if p is not None],
            "parts": {
                name: {
                    "pid": part.pid,
                    "argv": part.argv,
                    "log": str(part.log_path),
                    "children": part.descendants(),
                }
                for name, part in (("mooncake-master", self.master), ("mooncake-node", self.node))
            },
            "endpoints": {
                "master_address": self.endpoints.master_address,
                "rpc_port": self.endpoints.rpc_port,
                "metrics_port": self.endpoints.metrics_port,
                "node_port": self.endpoints.node_port,
                "host": self.endpoints.host,
            },
            "netns_pid": self.netns.pid,
            "segment_size": self.segment_size,
        }

    def status(self) -> dict:
        master_ok = self.master.alive() and self.master_healthy()
        node_ok = self.node.alive() and master_ok and self.node_healthy()
        return {
            "mooncake-master": {
                "pid": self.master.pid,
                "alive": self.master.alive(),
                "healthy": master_ok,
                "endpoint": self.endpoints.master_address,
                "health_url": self.endpoints.health_url,
                "log": str(self.master.log_path),
                "argv": self.master.argv,
            },
            "mooncake-node": {
                "pid": self.node.pid,
                "alive": self.node.alive(),
                "healthy": node_ok,
                "endpoint": f"{self.endpoints.host}:{self.endpoints.node_port}",
                "segment_size": self.segment_size,
                "log": str(self.node.log_path),
                "argv": self.node.argv,
            },
            "netns_pid": self.netns.pid,
        }


def _metric_sum(text: str, name: str) -> int:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name:
                try:
                    total += float(value)
                except ValueError:
                    pass
    return int(total)


def start_mooncake(
    netns: NetNamespace,
    log_dir: Path,
    segment_size: str = "1GB",
    health_timeout_s: float = 20.0,
    endpoints: MooncakeEndpoints | None = None,
    host: str = LOOPBACK,
    transport: Transport = Transport(),
) -> MooncakeStack:
    """Master + one storage node in netns bound to `host`, ports picked free inside it, both
    healthy."""
    ensure_ready(netns, min(health_timeout_s, 10.0))
    if endpoints is None:
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(netns.free_port())
        rpc, metrics, node = sorted(ports)
        endpoints = MooncakeEndpoints(rpc_port=rpc, metrics_port=metrics, node_port=node, host=host)
    stack = MooncakeStack(netns, endpoints, log_dir, segment_size, health_timeout_s, transport)
    return stack.start()


def start(spec: object, run_dir: Path, ns: object, host: str = LOOPBACK) -> MooncakeStack:
    """Serving-stack entry: ``spec`` is ``specs.MooncakeSpec`` (segment_size_bytes,
    startup_timeout_s, protocol, rdma_devices), ``ns`` the namespace Mooncake runs in
    (``NetNamespace`` or anything with the holder's ``pid``), ``host`` the address it binds
    there. Logs go to ``run_dir``."""
    segment_bytes = int(getattr(spec, "segment_size_bytes", 1 << 30))
    timeout_s = float(getattr(spec, "startup_timeout_s", 60.0))
    return start_mooncake(
        NetNamespace.of(ns),
        Path(run_dir),
        segment_size=str(segment_bytes),
        health_timeout_s=timeout_s,
        host=host,
        transport=Transport.of(spec),
    )
