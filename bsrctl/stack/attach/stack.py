"""A deployment bsrctl did not start (``stack.kind: attach``): vLLM at a URL, the LMCache MP
server (with the BSR server module) at an endpoint, optionally a Mooncake master.

bsrctl talks to it exactly as to the stack it launches (``ServingClient``: the same requests,
metrics, L1 clear, status) and never starts or stops any of its processes. The operator's own
commands (restart vLLM or LMCache, stop/start the remote tier) are run as given, bounded, and
only when the spec names them. Every endpoint is probed with a bounded wait first: one that
does not answer is a StackFailed naming it (exit 3), never a hang.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bsrctl.errors import BadInput, StackFailed
from bsrctl.specs import AttachSpec, StackSpec
from bsrctl.stack.attach import prerequisites
from bsrctl.stack.launch.process import http_get, http_ok
from bsrctl.stack.launch.serving.client import ServingClient
from bsrkv.settings import RestoreSettings

# L2 adapter types (their /status "type") and the tier each is
TIER_OF_TYPE = {"BsrFSL2Adapter": "fs", "FSL2Adapter": "fs", "BsrMooncakeL2Adapter": "mooncake"}
COMMANDS = ("restart_vllm", "restart_lmcache", "stop_remote_tier", "start_remote_tier")


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of ``tcp://HOST:PORT``, ``http://HOST:PORT`` or ``HOST:PORT``."""
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"no host:port in {address!r}")
    return parts.hostname, parts.port


def tcp_answers(address: str, timeout_s: float) -> str:
    """'' when a TCP connection to address opens within timeout_s, else why not."""
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ""
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def server_module_line(settings: RestoreSettings) -> str:
    """The exact ``--server-module`` argument that loads BSR into ``lmcache server``."""
    from bsrctl.stack.launch.extensions import bsr_extensions

    module = bsr_extensions(settings).server_module.to_json()
    return f"--server-module {shlex.quote(_compact_json(module))}"


def _compact_json(doc: Any) -> str:
    import json

    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


class AttachedStack(ServingClient):
    """The operator's running deployment, reached over its endpoints; owns no process."""

    attached = True
    mooncake = None  # no Mooncake handle: its master is the operator's
    bsr: Any = None  # the deployment's bsr.* client once connected (tier lookups use it)

    def __init__(self, spec: StackSpec, run_dir: Path) -> None:
        if spec.attach is None:
            raise StackFailed("AttachedStack needs stack.attach")
        self.spec = spec
        self.at: AttachSpec = spec.attach
        self.dir = Path(run_dir) / "stack"
        self.ns = None
        self.parts = {}  # nothing of it is bsrctl's
        self.ports = {}
        self.model_dir = None
        self._model_name = ""
        self._max_model_len: int | None = None
        self.commands_run: list[dict[str, Any]] = []  # operator commands, for the evidence

    # ---- endpoints -------------------------------------------------------------------------

    @property
    def vllm_url(self) -> str:
        return self.at.vllm_url.rstrip("/")

    @property
    def lmcache_http(self) -> str:
        host, _ = host_port(self.at.lmcache_url)
        return f"http://{host}:{self.at.lmcache_http_port}"

    @property
    def lmcache_mq_url(self) -> str:
        return self.at.lmcache_url

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def control_token(self) -> str | None:  # type: ignore[override]
        """The operator's token, read from the variable the spec names (None: unset)."""
        env = self.at.control_token_env
        return (os.environ.get(env) or None) if env else None

    @property
    def control_token_source(self) -> str:  # type: ignore[override]
        env = self.at.control_token_env
        if env is None:
            return "nowhere (stack.attach.control_token_env is not set)"
        return f"${env} (stack.attach.control_token_env)"

    def endpoints(self) -> dict[str, str | None]:
        return {
            "vllm_url": self.vllm_url,
            "lmcache_url": self.lmcache_mq_url,
            "lmcache_http": self.lmcache_http,
            "mooncake_master": self.at.mooncake_master,
        }

    def probe(self) -> None:
        """Every endpoint answers within connect_timeout_s, else StackFailed naming the first
        that does not (and the spec field that holds it)."""
        t = self.at.connect_timeout_s
        checks = [
            ("stack.attach.vllm_url", f"vLLM {self.vllm_url}/health",
             lambda: "" if http_ok(f"{self.vllm_url}/health", t) else "no HTTP 200"),
            ("stack.attach.lmcache_http_port", f"LMCache HTTP {self.lmcache_http}/healthcheck",
             lambda: "" if http_ok(f"{self.lmcache_http}/healthcheck", t) else "no HTTP 200"),
            ("stack.attach.lmcache_url", f"LMCache MP server {self.lmcache_mq_url}",
             lambda: tcp_answers(self.lmcache_mq_url, t)),
        ]  # fmt: skip
        if self.at.mooncake_master:
            addr = self.at.mooncake_master
            checks.append(
                ("stack.attach.mooncake_master", f"Mooncake master {addr}",
                 lambda: tcp_answers(addr, t))
            )  # fmt: skip
        for field, what, check in checks:
            t0 = time.monotonic()
            why = check()
            if why:
                raise StackFailed(
                    f"attach: {what} did not answer within {t:g} s ({why}, after "
                    f"{time.monotonic() - t0:.1f} s); check {field} and that the server runs"
                )
        self._model_name = self._served_model()

    def _served_model(self) -> str:
        doc = self._http("GET", f"{self.vllm_url}/v1/models", timeout_s=self.at.connect_timeout_s)
        models = [m.get("id") for m in (doc.get("data") or [])] if isinstance(doc, dict) else []
        if not models:
            raise StackFailed(f"attach: vLLM at {self.vllm_url} serves no model (/v1/models)")
        self._max_model_len = doc["data"][0].get("max_model_len")
        return str(models[0])

    def check_geometry(self) -> None:
        """The spec's chunk size is the server's (c and every expected count hang on it)."""
        got = self.lmcache_status().get("chunk_size")
        want = self.spec.lmcache.chunk_size
        if got is not None and int(got) != want:
            raise BadInput(
                f"stack.lmcache.chunk_size: {want} but the attached LMCache server at "
                f"{self.lmcache_http} reports chunk_size {got}; set stack.lmcache.chunk_size: {got}"
            )

    def up(self, settings: RestoreSettings) -> None:
        """Connect: every endpoint answers, the module is loaded, every prerequisite is there
        (``bsrctl.stack.attach.prerequisites``), the geometry agrees. Starts nothing. StackFailed
        names the endpoint, prints the --server-module line, or names each flag or variable
        to add."""
        self.probe()
        if not self.module_loaded():
            raise StackFailed(
                f"attach: the LMCache server at {self.lmcache_mq_url} does not run the BSR "
                f"server module (bsr.status absent from {self.lmcache_http}/status); add this "
                f"argument to the operator's `lmcache server` command:\n"
                f"  {server_module_line(settings)}"
            )
        lacking = prerequisites.missing(
            self._reset_route_status(), self._probe_usage(), self.lmcache_status(),
            self.lmcache_mq_url,
        )  # fmt: skip
        token = prerequisites.control_token_missing(self.at.control_token_env)
        lacking += [token] if token else []
        if lacking:
            raise StackFailed(prerequisites.message(lacking))
        self.check_geometry()

    def _reset_route_status(self) -> int | None:
        """GET on the POST-only /reset_prefix_cache: 405 where dev mode serves it, 404 not."""
        got = http_get(f"{self.vllm_url}/reset_prefix_cache", self.at.connect_timeout_s)
        return None if got is None else got[0]

    def _probe_usage(self) -> dict[str, Any] | None:
        """The usage block of a 3-token greedy completion (shorter than a chunk: stores
        nothing), to see whether vLLM reports prompt_tokens_details."""
        body = {"model": self._model_name, "prompt": [1, 2, 3], "max_tokens": 1,
                "temperature": 0.0}  # fmt: skip
        try:
            resp = self._http("POST", f"{self.vllm_url}/v1/completions", body,
                              self.spec.vllm.request_timeout_s)  # fmt: skip
        except OSError as exc:
            raise StackFailed(f"attach: vLLM's probe completion failed ({exc})") from None
        return resp.get("usage") if isinstance(resp, dict) else None

    def held_chunks(self, ids: list[int], tier: str, ranks: int = 1) -> int:
        """The prompt's whole chunks `tier` holds, by a real lookup of every L2 adapter
        through the server (``bsr.holds``); 0 before connecting or when none answers."""
        if self.bsr is None:
            return 0
        reply = self.bsr.holds(ids, self._model_name, ranks)
        names = self.tier_names()
        return max(
            (h for n, h in zip(names, reply.held_chunks_by_adapter, strict=False) if n == tier),
            default=0,
        )

    def down(self) -> None:
        """Nothing of it is bsrctl's to stop."""

    def vllm_log(self) -> Path | None:
        return self.at.vllm_log

    def fault_tiers(self) -> tuple[str, ...]:
        return tuple(
            (a.get("bsr_fault") or {}).get("name")
            for a in self.l2_adapters()
            if (a.get("bsr_fault") or {}).get("control_path")
        )

    def module_loaded(self) -> bool:
        """Whether the LMCache server runs the BSR server module (its status under "bsr")."""
        status = self.lmcache_status()
        return isinstance(status, dict) and isinstance(status.get("bsr"), dict)

    # ---- what the servers report -------------------------------------------------------------

    def l2_adapters(self) -> list[dict[str, Any]]:
        sm = self.lmcache_status().get("storage_manager") or {}
        return list(sm.get("l2_adapters") or [])

    def tier_names(self) -> list[str]:
        """Each L2 adapter's tier, in the server's order: the fault wrapper's name, else its
        type (LMCache's stock FS adapter and bsrctl's are "fs")."""
        out: list[str] = []
        for a in self.l2_adapters():
            name = (a.get("bsr_fault") or {}).get("name") or str(a.get("type", "?"))
            out.append(TIER_OF_TYPE.get(name, name))
        return out

    def tiers(self) -> list[str]:
        """The L2 tiers the server reports, FS first."""
        return sorted(self.tier_names(), key=lambda t: (t != "fs", t))

    @property
    def fs_l2_dir(self) -> Path:
        """The FS tier's folder as the server reports it (read where bsrctl runs: a folder
        bsrctl cannot see reads as holding nothing, so seeding says UNKNOWN, never PASS)."""
        for a in self.l2_adapters():
            if a.get("base_path"):
                return Path(a["base_path"])
        return self.dir / "no-fs-tier"

    def fault_control(self, tier: str) -> Path:
        for a in self.l2_adapters():
            fault = a.get("bsr_fault") or {}
            if fault.get("name") == tier and fault.get("control_path"):
                return Path(fault["control_path"])
        raise StackFailed(
            f"attach: the LMCache server has no fault wrapper named {tier!r} with a control "
            "path; load the tier behind bsrkv.lmcache_ext.faults.adapter to inject faults"
        )

    def versions(self) -> dict[str, Any]:
        """What the servers say they are: vLLM's /version, the model it serves, LMCache's
        status (version where it reports one), the module's config and the L2 adapters."""
        out: dict[str, Any] = {"served_model": self._model_name}
        got = http_get(f"{self.vllm_url}/version", self.at.connect_timeout_s)
        if got is not None and got[0] == 200:
            try:
                import json

                out["vllm"] = str(json.loads(got[1]).get("version"))
            except ValueError:
                out["vllm"] = got[1].decode(errors="replace")[:80]
        status = self.lmcache_status()
        for key in ("version", "lmcache_version"):
            if key in status:
                out["lmcache"] = str(status[key])
        return out

    def settings_reported(self) -> dict[str, Any]:
        status = self.lmcache_status()
        bsr = status.get("bsr") or {}
        return {
            "bsr_config": bsr.get("config"),
            "effective_window_chunks": bsr.get("effective_window_chunks"),
            "effective_budget_chunks": bsr.get("effective_budget_chunks"),
            "l2_adapters": [
                {k: v for k, v in a.items() if k in ("type", "base_path", "master_server_address",
                                                      "load_concurrency", "checksum")}
                | ({"fault_wrapper": a["bsr_fault"]["name"]} if a.get("bsr_fault") else {})
                for a in self.l2_adapters()
            ],
            **{k: status[k] for k in ("chunk_size", "hash_algorithm", "engine_type",
                                      "server_module_plugins") if k in status},
            "vllm_max_model_len": self._max_model_len,
        }  # fmt: skip

    def health(self) -> dict[str, Any]:
        t = self.at.connect_timeout_s
        out: dict[str, Any] = {
            "vllm": {"healthy": http_ok(f"{self.vllm_url}/health", t), "endpoint": self.vllm_url},
            "lmcache": {
                "healthy": http_ok(f"{self.lmcache_http}/healthcheck", t),
                "endpoint": self.lmcache_http,
            },
        }
        if self.at.mooncake_master:
            ok = tcp_answers(self.at.mooncake_master, t) == ""
            out["mooncake-master"] = {"healthy": ok, "endpoint": self.at.mooncake_master}
        return out

    def state(self) -> dict[str, Any]:
        return {"operator_commands_run": self.commands_run}

    # ---- the operator's commands -------------------------------------------------------------

    def has_command(self, name: str) -> bool:
        return getattr(self.at.commands, name) is not None

    def run_command(self, name: str) -> float:
        """Run the operator's command `name` as given (sh -c), bounded; seconds it took.
        StackFailed when it is not given, fails or runs over."""
        if name not in COMMANDS:
            raise ValueError(name)
        cmd = getattr(self.at.commands, name)
        if cmd is None:
            raise StackFailed(f"attach: stack.attach.commands.{name} is not given")
        t0 = time.monotonic()
        try:
            res = subprocess.run(
                ["sh", "-c", cmd], capture_output=True, text=True,
                timeout=self.at.commands.timeout_s,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise StackFailed(
                f"attach: stack.attach.commands.{name} ran over "
                f"{self.at.commands.timeout_s:g} s: {cmd}"
            ) from None
        took = round(time.monotonic() - t0, 3)
        self.commands_run.append({"name": name, "rc": res.returncode, "s": took})
        if res.returncode != 0:
            raise StackFailed(
                f"attach: stack.attach.commands.{name} exited {res.returncode}: {cmd}",
                (res.stderr or res.stdout)[-2000:],
            )
        return took

    def wait_healthy(self, part: str, timeout_s: float) -> None:
        """After an operator restart: the part answers again within timeout_s."""
        url = {"vllm": f"{self.vllm_url}/health", "lmcache": f"{self.lmcache_http}/healthcheck"}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if http_ok(url[part], 2.0):
                return
            time.sleep(0.2)
        raise StackFailed(
            f"attach: {part} at {url[part]} not healthy {timeout_s:g} s after restart"
        )
