"""The serving stack: LMCache MP server [+ Mooncake] + vLLM OpenAI server, under supervision.

Order: (network namespace when Mooncake is on) → Mooncake master + node → LMCache server →
vLLM. Each part has a command line, a PID, a log under <run>/stack/, a bounded health wait
and a stop by PID. The restore settings (W, B, timeouts, load concurrency, checksums) come
from the caller; with W = 0 the server module passes everything to the stock handlers.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bsrctl.errors import BadInput, StackFailed
from bsrctl.settings import RestoreSettings
from bsrctl.specs import StackSpec
from bsrctl.stack import tinymodel
from bsrctl.stack.netns import NetNamespace, maybe_inside, start_netns
from bsrctl.stack.process import (
    Supervised,
    ensure_port_free,
    free_port,
    http_ok,
    pids_alive,
    stop_pids,
    tcp_open,
)

VENV_BIN = Path(sys.executable).parent
SERVER_MODULE = "bsrctl.lmcache_ext.server"
# vLLM's connector gives up on a server request after this; BSR's whole retrieve must end
# (installed or failed closed) well before it, or a late window overwrites the recompute.
MQ_TIMEOUT_S = 60.0
# The server module's config keys (the rest of RestoreSettings configures the L2 adapters).
SERVER_KEYS = (
    "window_chunks", "admission_budget_chunks", "window_timeout_s", "probe_timeout_s",
    "admission_timeout_s", "retrieve_deadline_s", "drain_timeout_s", "stall_guard_s",
)  # fmt: skip


SHM_PREFIXES = ("psm_", "lmcache_kv_")


def shm_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIXES)}


def shm_mapped(name: str) -> bool:
    """Whether any live process maps /dev/shm/<name>."""
    needle = f"/dev/shm/{name}"
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if needle in maps.read_text():
                return True
        except OSError:
            continue
    return False


def base_env() -> dict[str, str]:
    """Telemetry off, loopback only, bounded CPU KV cache (STACK-NOTES)."""
    return {
        "LMCACHE_TRACK_USAGE": "false",
        "LMCACHE_DISABLE_BANNER": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


@dataclass(frozen=True)
class Completion:
    output_token_ids: tuple[int, ...]  # generated ids, greedy
    prompt_tokens: int  # as vLLM counted them
    cached_tokens: int  # usage.prompt_tokens_details.cached_tokens (local + external)
    external_hit_tokens: int  # delta of vllm:external_prefix_cache_hits_total
    ttft_s: float  # time to first token as vLLM measured it (its TTFT histogram's delta)
    request_s: float  # wall time of the whole (non-streamed) request, client side


class ServingStack:
    """One deployment. `up()` starts what is down; `down()` stops everything by PID."""

    def __init__(
        self, spec: StackSpec, run_dir: Path, restore: RestoreSettings | None = None
    ) -> None:
        self.spec = spec
        self.restore = restore or RestoreSettings()
        if not 0 < self.restore.retrieve_deadline_s < MQ_TIMEOUT_S:
            raise BadInput(
                f"restore.retrieve_deadline_s: {self.restore.retrieve_deadline_s} s must lie in "
                f"(0, {MQ_TIMEOUT_S:g}) on the serving stack (vLLM's connector recomputes after "
                f"{MQ_TIMEOUT_S:g} s); use e.g. {0.75 * MQ_TIMEOUT_S:g}"
            )
        self.dir = Path(run_dir) / "stack"
        self.ns: NetNamespace | None = None
        self.parts: dict[str, Supervised] = {}
        self.ports: dict[str, int] = {}
        self.model_dir: Path | None = None
        self.mooncake: Any = None  # bsrctl.stack.mooncake handle when enabled
        self.launched: list[Supervised] = []  # every process ever started, for the audit
        self.shm_at_up: set[str] = set()  # segments there before this stack started

    def _launch(self, part: Supervised) -> None:
        key = "vllm" if part.name.startswith("vllm") else part.name
        self.parts[key] = part
        self.launched.append(part)
        part.shm_before = shm_segments()
        part.start()
        self._save_state()  # a bsrctl killed mid-start still leaves every PID on record

    # ---- lifecycle -------------------------------------------------------------------------

    def up(self) -> None:
        self.shm_at_up = shm_segments()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.model_dir = self._model()
            if self.spec.mooncake.enabled:
                self.ns = start_netns(self.dir)
                self.launched.append(self.ns.holder)
            self._allocate_ports()  # a port in use is bad input: fail before starting anything
            if self.spec.mooncake.enabled:
                self._start_mooncake()
            self.start_lmcache()
            self.start_vllm()
        except BaseException:
            self.down()
            raise
        self._save_state()

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
        if self.ns is not None:
            self.ns.stop()
            self.ns = None
        self._save_state()

    def all_pids(self) -> list[int]:
        pids: list[int] = []
        for part in self.parts.values():
            pids += [*part.descendants(), *([part.pid] if part.pid else [])]
        if self.ns is not None and self.ns.holder.pid:
            pids.append(self.ns.holder.pid)
        return pids

    def _model(self) -> Path:
        if self.spec.vllm.model == "tiny":
            return tinymodel.build()
        path = Path(self.spec.vllm.model)
        if not (path / "config.json").is_file():
            raise StackFailed(
                f"stack.vllm.model: {path} has no config.json; give a local model folder or 'tiny'"
            )
        return path

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
        from bsrctl.stack import mooncake  # written by the L2-adapter work; imports the wheel

        self.mooncake = mooncake.start(self.spec.mooncake, self.dir, self.ns)
        self._note_mooncake()  # the audit lists parts in launch order

    def start_lmcache(self, l1_size_bytes: int | None = None) -> None:
        lm = self.spec.lmcache
        l1 = l1_size_bytes if l1_size_bytes is not None else lm.l1_size_bytes
        port = self._port("lmcache.port", lm.port)
        http_port = self._port("lmcache.http_port", lm.http_port)
        argv = [
            *self._prefix(),
            str(VENV_BIN / "lmcache"),
            "server",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--l1-size-gb", repr(l1 / (1 << 30)),
            "--no-l1-use-lazy",
            "--eviction-policy", "LRU",
            "--chunk-size", str(lm.chunk_size),
            "--http-host", "127.0.0.1",
            "--http-port", str(http_port),
            "--disable-observability",
            "--disable-metrics",
            "--supported-transfer-mode", "auto",
        ]  # fmt: skip
        for adapter in self._l2_adapters():
            argv += ["--l2-adapter", json.dumps(adapter)]
        argv += ["--server-module", json.dumps(self._server_module_arg())]
        part = Supervised("lmcache", argv, self.dir / "lmcache.log", env=base_env())
        self._launch(part)
        url = f"http://127.0.0.1:{http_port}/healthcheck"
        with maybe_inside(self.ns):
            part.wait_healthy(lambda: http_ok(url), lm.startup_timeout_s)
            part.wait_healthy(lambda: tcp_open("127.0.0.1", port), 30)

    def _l2_adapters(self) -> list[dict[str, Any]]:
        """bsrctl's own L2 adapters, each behind the fault wrapper (inert until a rule is
        armed through its control file), so failure matrices inject by real means."""
        lm = self.spec.lmcache
        out: list[dict[str, Any]] = []
        if lm.fs_l2:
            l2 = self.dir / "l2-fs"
            l2.mkdir(parents=True, exist_ok=True)
            inner = {
                "type": "bsr_fs",
                "base_path": str(l2),
                "load_concurrency": self.restore.load_concurrency,
                "checksum": self.restore.checksum,
            }
            out.append(fault_wrapped("fs", inner, self.fault_control("fs")))
        if self.spec.mooncake.enabled and self.mooncake is not None:
            inner = self.mooncake.l2_adapter_config()["adapter_params"]
            out.append(
                fault_wrapped(
                    "mooncake",
                    {"type": "bsr_mooncake", **inner},
                    self.fault_control("mooncake"),
                    verify=self.restore.checksum,
                )
            )
        return out

    def fault_control(self, tier: str) -> Path:
        """The file a tier's fault wrapper re-reads: write rules there to inject faults."""
        return self.dir / f"faults-{tier}.json"

    def _server_module_arg(self) -> dict[str, Any]:
        r = self.restore
        config = {k: getattr(r, k) for k in SERVER_KEYS}
        config["admission_budget_chunks"] = r.budget_chunks
        return {
            "module_path": SERVER_MODULE,
            "factory_name": "build_server_modules",
            "config": config,
        }

    def start_vllm(self) -> None:
        v = self.spec.vllm
        port = self._port("vllm.port", v.port)
        kv = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://127.0.0.1",
                "lmcache.mp.port": self.ports["lmcache.port"],
                "lmcache.mp.mp_transfer_mode": "lmcache_driven",
                "lmcache.mp.mq_timeout": MQ_TIMEOUT_S,
            },
        }
        argv = [
            *self._prefix(),
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--enforce-eager",
            "--max-model-len", str(v.max_model_len),
            "--dtype", "float32",
            "--seed", "0",
            "--max-num-seqs", "4",
            "--enable-prompt-tokens-details",
            "--tensor-parallel-size", str(v.tensor_parallel_size),
            "--kv-transfer-config", json.dumps(kv),
        ]  # fmt: skip
        env = {
            **base_env(),
            "VLLM_CPU_KVCACHE_SPACE": str(v.kvcache_space_gib),
            "VLLM_CACHE_ROOT": str(self.dir / "vllm-cache"),
            "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache: make vLLM forget locally
        }
        if v.tensor_parallel_size > 1:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
                str(i % (os.cpu_count() or 1)) for i in range(v.tensor_parallel_size)
            )
        part = Supervised("vllm", argv, self.dir / "vllm.log", env=env)
        self._launch(part)
        with maybe_inside(self.ns):
            part.wait_healthy(lambda: http_ok(f"{self.vllm_url}/health"), v.startup_timeout_s)

    def restart(self, name: str) -> None:
        """Stop one part by PID and start it again (vLLM forgets its local prefix cache)."""
        part = self.parts.pop(name)
        part.stop()
        self._cleanup_shm(part)
        {"vllm": self.start_vllm, "lmcache": self.start_lmcache}[name]()
        self._save_state()

    def _cleanup_shm(self, part: Supervised) -> None:
        remove_unmapped_shm(part.shm_before)

    # ---- client calls ----------------------------------------------------------------------

    @property
    def vllm_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['vllm.port']}"

    @property
    def lmcache_http(self) -> str:
        return f"http://127.0.0.1:{self.ports['lmcache.http_port']}"

    def _http(self, method: str, url: str, body: Any = None, timeout_s: float = 30) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with maybe_inside(self.ns), urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over label sets."""
        text = self._http("GET", f"{self.vllm_url}/metrics")
        out: dict[str, float] = {}
        for line in str(text).splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                continue
        return out

    def complete(self, prompt_ids: list[int], max_tokens: int) -> Completion:
        """One greedy request by token ids; raises StackFailed when vLLM does not answer."""
        before = self.metrics()
        body = {
            "model": str(self.model_dir),
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        t0 = time.monotonic()
        try:
            resp = self._http(
                "POST", f"{self.vllm_url}/v1/completions", body, self.spec.vllm.request_timeout_s
            )
        except OSError as exc:
            part = self.parts.get("vllm")
            # A killed server drops the connection a moment before it can be reaped: give it
            # a bounded moment so "gone" is not misreported as "alive".
            alive = part is not None and part.wait_exit(timeout_s=5.0) is None
            raise StackFailed(
                f"vLLM request failed ({exc}); vLLM process {'alive' if alive else 'gone'}",
                part.tail() if part else "",
            ) from None
        elapsed = time.monotonic() - t0
        after = self.metrics()
        usage = resp.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        return Completion(
            output_token_ids=tuple(resp["choices"][0]["token_ids"]),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int(details.get("cached_tokens") or 0),
            external_hit_tokens=int(_delta(after, before, "vllm:external_prefix_cache_hits_total")),
            ttft_s=_ttft_s(after, before, elapsed),
            request_s=elapsed,
        )

    def forget_local(self, wait_s: float = MQ_TIMEOUT_S) -> None:
        """Make vLLM forget its local prefix cache (not the external one). vLLM answers a
        request before the connector has saved its KV and keeps the blocks until then, and
        refuses the reset while any block is held: ask again until wait_s has passed (the
        connector gives up on a save after MQ_TIMEOUT_S)."""
        deadline = time.monotonic() + wait_s
        while True:
            resp = self._http("POST", f"{self.vllm_url}/reset_prefix_cache")
            if not (isinstance(resp, dict) and resp.get("success") is False):
                return
            if time.monotonic() >= deadline:
                raise StackFailed(
                    f"vLLM refused /reset_prefix_cache for {wait_s:.0f} s (blocks still held: "
                    "a request running, or a KV save that never finished)"
                )
            time.sleep(0.2)

    def clear_l1(self) -> None:
        """Empty LMCache's L1 so the next load must come from L2."""
        self._http("POST", f"{self.lmcache_http}/cache/clear", {"tier": "l1", "force": True})

    def tier_reads(self) -> dict[str, int]:
        """Keys each L2 tier has served at load since the server started (its own counter)."""
        out: dict[str, int] = {}
        for adapter in self.lmcache_status()["storage_manager"].get("l2_adapters", []):
            fault = adapter.get("bsr_fault")
            if fault:
                out[fault["name"]] = int(fault.get("load_hit_keys", 0))
        return out

    def lmcache_status(self) -> dict[str, Any]:
        return self._http("GET", f"{self.lmcache_http}/status")

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
        }

    def _note_mooncake(self) -> None:
        """Mooncake restarts replace its Supervised handles: remember every one of them."""
        for part in (self.mooncake.master, self.mooncake.node):
            if part.pid and all(part is not q for q in self.launched):
                self.launched.append(part)

    def _save_state(self) -> None:
        if self.mooncake is not None:
            self._note_mooncake()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "state.json").write_text(json.dumps(self.state(), indent=2))

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        out = {}
        for dist in ("vllm-cpu", "vllm", "lmcache", "mooncake-transfer-engine-non-cuda", "torch"):
            try:
                out[dist] = version(dist)
            except PackageNotFoundError:
                continue
        if self.model_dir:
            out["model_sha256"] = tinymodel.model_sha256(self.model_dir)
        return out


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def _ttft_s(after: dict[str, float], before: dict[str, float], fallback_s: float) -> float:
    """vLLM's own TTFT of the one request between two metric reads (requests are sent one
    at a time); the request's wall time when the histogram did not move exactly once."""
    hist = "vllm:time_to_first_token_seconds"
    if _delta(after, before, f"{hist}_count") != 1:
        return fallback_s
    return _delta(after, before, f"{hist}_sum")


def fault_wrapped(
    name: str, inner: dict[str, Any], control: Path, verify: bool = False
) -> dict[str, Any]:
    """An --l2-adapter spec: `inner` behind bsrctl's fault adapter, loaded via LMCache's
    plugin type (the server builds adapters before any server module runs)."""
    params: dict[str, Any] = {"name": name, "control_path": str(control), "inner": inner}
    if verify:  # the inner adapter keeps no checksums of its own (Mooncake)
        params.update(verify=True, checksum_dir=str(control.parent / f"checksums-{name}"))
    return {
        "type": "plugin",
        "module_path": "bsrctl.lmcache_ext.faults.adapter",
        "class_name": "BsrFaultL2Adapter",
        "adapter_params": params,
    }


def check_ports(spec: StackSpec) -> None:
    """Fail on a taken port before anything starts (in a private namespace none can be)."""
    if spec.mooncake.enabled:
        return
    for name, port in (
        ("stack.lmcache.port", spec.lmcache.port),
        ("stack.lmcache.http_port", spec.lmcache.http_port),
        ("stack.vllm.port", spec.vllm.port),
    ):
        if port:
            ensure_port_free(port, name)


def stop_from_state(state_path: Path, timeout_s: float = 15.0) -> list[int]:
    """`bsrctl stack down`: stop every PID a saved state names. Returns PIDs still alive."""
    state = json.loads(Path(state_path).read_text())
    pids: list[int] = []
    for part in state.get("parts", {}).values():
        pids += [*part.get("children", []), part["pid"]]
    moon = state.get("mooncake") or {}
    pids += [p for p in moon.get("pids", []) if p]
    if state.get("netns_pid"):
        pids.append(state["netns_pid"])
    known = {int(k): v for k, v in state.get("pid_start_times", {}).items()}
    now = start_times([p for p in pids if p])
    # Only the processes we started: same PID and same start time as recorded.
    pids = [p for p, t in now.items() if known.get(p) == t]
    stop_pids(pids, timeout_s)
    if "shm_at_up" in state:
        remove_unmapped_shm(set(state["shm_at_up"]))
    return pids_alive(pids)


def remove_unmapped_shm(before: set[str]) -> list[str]:
    """Killed vLLM and LMCache processes leave /dev/shm segments (psm_*, lmcache_kv_*, 1 GiB
    each in lmcache_driven mode): remove those not in ``before`` that no live process
    still maps. Returns the names removed."""
    removed = []
    for seg in sorted(shm_segments() - before):
        if not shm_mapped(seg):
            (Path("/dev/shm") / seg).unlink(missing_ok=True)
            removed.append(seg)
    return removed


def start_times(pids: list[int]) -> dict[int, float]:
    """PID -> process start time, for the PIDs alive now."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).create_time()
        except psutil.Error:
            continue
    return out
