"""The e2e LMCache server's stack: the real ``lmcache server`` with the BSR module and a real
vLLM OpenAI server over the tiny Llama, started and stopped by PID, and the module's shared
state (model, prompt, canonical output, figures)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

from bsrctl.stack.launch.serving.vllm_cache import vllm_cache_root
from bsrkv.control_token import CONTROL_TOKEN_ENV, new_token, sealed

# ---------------------------------------------------------------------------------------
# e2e: the real `lmcache server` with this module + a real vLLM over the tiny Llama
# ---------------------------------------------------------------------------------------

E2E_CHUNK = 256
E2E_PREFIX_CHUNKS = 15
E2E_TAIL_TOKENS = 40  # < one chunk: the cold run stores exactly the 15-chunk prefix
E2E_MAX_TOKENS = 16
E2E_VLLM_START_S = 360.0  # 2 shared cores: be patient, but bounded
E2E_REQUEST_S = 120.0


def _e2e_env(cache_root: Path) -> dict[str, str]:
    return {
        "LMCACHE_TRACK_USAGE": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(vllm_cache_root(cache_root)),  # modelinfos/ shared
        "TOKENIZERS_PARALLELISM": "false",
    }


def _shm_segments(pids: list[int], log: Path) -> set[str]:
    """Shared-memory segments our vLLM created: psm_* (message queues) and lmcache_kv_*
    (its KV cache moved to POSIX shm in lmcache_driven mode), from its maps and its log."""
    prefixes = ("/dev/shm/psm_", "/dev/shm/lmcache_kv_")
    found: set[str] = set()
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                parts = line.split()
                if len(parts) >= 6 and parts[5].startswith(prefixes):
                    found.add(parts[5])
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = str(fd.readlink())
                except OSError:
                    continue
                if target.startswith(prefixes):
                    found.add(target)
        except OSError:
            continue
    try:
        for m in re.finditer(r"to SHM /(lmcache_kv_\d+_\d+)", log.read_text(errors="replace")):
            found.add(f"/dev/shm/{m.group(1)}")
    except OSError:
        pass
    return found


class _Stack:
    """One lmcache server (with the BSR module) and one vLLM OpenAI server."""

    def __init__(
        self, root: Path, model: Path, l2_adapter: dict, l1_bytes: int, cfg: dict, tp: int = 1
    ):
        from bsrctl.stack.launch.process import Supervised, free_port

        self.root, self.model = root, model
        self.mq_port, self.lmc_http = free_port(), free_port()
        self.vllm_port = free_port()
        env = _e2e_env(root / "vllm-cache")
        module = {"module_path": "bsrkv.lmcache_ext.server", "config": cfg}
        venv_bin = Path(sys.executable).parent
        self.server_argv = [
            str(venv_bin / "lmcache"),
            "server",
            "--host", "127.0.0.1", "--port", str(self.mq_port),
            "--l1-size-gb", repr(l1_bytes / 2**30),
            "--eviction-policy", "LRU",
            "--chunk-size", str(E2E_CHUNK),
            "--http-host", "127.0.0.1", "--http-port", str(self.lmc_http),
            "--disable-observability",
            "--supported-transfer-mode", "auto",
            "--l2-adapter", json.dumps(l2_adapter),
            "--server-module", json.dumps(module),
        ]  # fmt: skip
        self.token = new_token()  # the server module's control token, as a launch draws it
        server_env = {**env, CONTROL_TOKEN_ENV: self.token}
        self.server = Supervised("lmcache", self.server_argv, root / "lmcache.log", env=server_env)
        kv = {
            "kv_connector": "LMCacheMPConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "lmcache.mp.host": "tcp://127.0.0.1",
                "lmcache.mp.port": self.mq_port,
                "lmcache.mp.mp_transfer_mode": "lmcache_driven",
            },
        }
        self.vllm_argv = [
            str(venv_bin / "python"), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--host", "127.0.0.1", "--port", str(self.vllm_port),
            "--enforce-eager", "--max-model-len", "8192", "--dtype", "float32",
            "--seed", "0", "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
            "--kv-transfer-config", json.dumps(kv),
        ]  # fmt: skip
        vllm_env = dict(env)
        if tp > 1:
            self.vllm_argv += ["--tensor-parallel-size", str(tp)]
            vllm_env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
        else:  # as bsrctl launches one rank (stack/launch/profile.py): the worker in the engine
            # core
            vllm_env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.vllm = Supervised("vllm", self.vllm_argv, root / "vllm.log", env=vllm_env)
        self._client: Any = None
        self._segments: set[str] = set()

    def start(self) -> None:
        from bsrctl.stack.launch.process import http_ok

        self.server.start()
        self.server.wait_healthy(
            lambda: http_ok(f"http://127.0.0.1:{self.lmc_http}/healthcheck"), 120.0
        )
        self.vllm.start()
        try:
            self.vllm.wait_healthy(
                lambda: http_ok(f"http://127.0.0.1:{self.vllm_port}/health"),
                E2E_VLLM_START_S,
                1.0,
            )
        finally:
            self._remember_segments()

    def _remember_segments(self) -> None:
        """Note our vLLM's shm segments while every process of it is alive to be asked."""
        pids = [p for p in [self.vllm.pid, *self.vllm.descendants()] if p]
        self._segments |= _shm_segments(pids, self.root / "vllm.log")

    def stop(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
            self._client = None
        self._remember_segments()
        self.vllm.stop(30.0)
        self.server.stop(30.0)
        for seg in self._segments:
            Path(seg).unlink(missing_ok=True)

    # ---- server_module_call --------------------------------------------------------------

    def call(
        self, method: str, payload: dict | None = None, timeout_s: float = 60.0, token: Any = ...
    ) -> dict:
        """A ``server_module_call``; mutating methods carry the token (``token``: another,
        or None for none)."""
        from lmcache.v1.multiprocess.protocols.server_module import ServerModuleCallRequest
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        if self._client is None:
            self._client = RequestClientFactory.create(f"tcp://127.0.0.1:{self.mq_port}")
        body = sealed(method, payload, self.token if token is ... else token)
        req = ServerModuleCallRequest(method=method, payload=json.dumps(body).encode())
        resp = self._client.server_module_call(req).result(timeout=timeout_s)
        assert resp.success, f"{method}: {resp.error}"
        return json.loads(resp.payload)

    # ---- vLLM ---------------------------------------------------------------------------

    def complete(self, prompt: list[int]) -> dict:
        import urllib.error
        import urllib.request

        body = {
            "model": str(self.model),
            "prompt": prompt,
            "max_tokens": E2E_MAX_TOKENS,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.vllm_port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=E2E_REQUEST_S) as resp:
                out = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"vLLM answered {e.code}: {e.read()[:500]!r}") from None
        choice = out["choices"][0]
        ids = choice.get("token_ids")
        assert ids, f"no token ids in the response: {sorted(choice)}"
        details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
        return {
            "token_ids": ids,
            "sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
            "cached_tokens": int(details.get("cached_tokens") or 0),
            "elapsed_s": time.monotonic() - t0,
        }

    def external_hits(self) -> float:
        import urllib.request

        url = f"http://127.0.0.1:{self.vllm_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:external_prefix_cache_hits_total"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log_text(self) -> str:
        return (self.root / "vllm.log").read_text(errors="replace")


def _fault_l2(base: Path) -> dict:
    """bsrctl's FS L2 behind bsrctl's fault adapter (no rules armed: a plain FS tier)."""
    return {
        "type": "plugin",
        "module_path": "bsrkv.lmcache_ext.faults.adapter",
        "class_name": "BsrFaultL2Adapter",
        "adapter_params": {"name": "fs", "inner": {"type": "bsr_fs", "base_path": str(base)}},
    }


class _E2E:
    """Shared state of the e2e module: model, prompt, canonical output, the stack."""

    def __init__(self, root: Path) -> None:
        from bsrctl.stack.launch import tinymodel

        self.root = root
        self.model = tinymodel.build()
        self.chunk_bytes = tinymodel.TinyModelRecipe().kv_bytes_per_token() * E2E_CHUNK
        vocab = tinymodel.vocab_size(self.model)
        rng = random.Random(20261129)
        n = E2E_PREFIX_CHUNKS * E2E_CHUNK + E2E_TAIL_TOKENS
        self.prompt = [rng.randrange(2, vocab) for _ in range(n)]
        self.prefix_tokens = E2E_PREFIX_CHUNKS * E2E_CHUNK
        self.l2_dir = root / "l2"
        self.canonical = ""
        self.figures: list[dict] = []
        self.stack = _Stack(
            root / "stack-a", self.model, _fault_l2(self.l2_dir), 64 << 20, {"window_chunks": 2}
        )

    def record(self, **figures: Any) -> None:
        self.figures.append(figures)
        print("BSR-E2E", json.dumps(figures, sort_keys=True), flush=True)
        (self.root / "figures.jsonl").open("a").write(json.dumps(figures, sort_keys=True) + "\n")
