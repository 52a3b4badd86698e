"""An operator's own deployment, as a cluster's tooling would start it: vLLM + LMCache MP server
with their own command lines, NOT bsrctl's stack code (nothing of ``bsrctl.stack`` is imported).
Like an operator, it adds the BSR ``--server-module`` and loads its FS tier behind bsrctl's
fault-adapter plugin.

    python operator_stack.py up DIR --model MODEL [--no-module] [--only-lmcache]
    python operator_stack.py restart-vllm DIR | restart-lmcache DIR
    python operator_stack.py down DIR

DIR/state.json holds every part's PID, process group, command line and endpoints. Each part
runs in its own session (its process group is its PID) so that a restart or `down` stops it
with every child by that id; `up` and the restarts return once the part answers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
MARK = "BSRCTL_OPERATOR_DEPLOYMENT"  # in every part's environment: the test finds them by it
CHUNK = 256
L1_GB = 64 / 1024  # 64 MiB, as ladders/cpu-smoke.yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return 200 <= r.status < 300
    except OSError:
        return False


def env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        MARK: str(root),
        "LMCACHE_TRACK_USAGE": "false",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
        "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache
    }


def lmcache_argv(root: Path, ports: dict[str, int], module: bool) -> list[str]:
    fs = {
        "type": "plugin",
        "module_path": "bsrctl.lmcache_ext.faults.adapter",
        "class_name": "BsrFaultL2Adapter",
        "adapter_params": {
            "name": "fs",
            "control_path": str(root / "faults-fs.json"),
            "inner": {"type": "bsr_fs", "base_path": str(root / "l2-fs"), "checksum": True},
        },
    }
    argv = [
        str(VENV_BIN / "lmcache"), "server",
        "--host", "127.0.0.1", "--port", str(ports["lmcache"]),
        "--http-host", "127.0.0.1", "--http-port", str(ports["lmcache_http"]),
        "--l1-size-gb", repr(L1_GB), "--no-l1-use-lazy", "--eviction-policy", "LRU",
        "--chunk-size", str(CHUNK), "--disable-observability", "--disable-metrics",
        "--supported-transfer-mode", "auto",
        "--l2-adapter", json.dumps(fs),
    ]  # fmt: skip
    if module:
        argv += ["--server-module", json.dumps({"module_path": "bsrctl.lmcache_ext.server"})]
    return argv


def vllm_argv(model: str, ports: dict[str, int]) -> list[str]:
    kv = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": ports["lmcache"],
            "lmcache.mp.mp_transfer_mode": "lmcache_driven",
            "lmcache.mp.mq_timeout": 60.0,
        },
    }
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--host", "127.0.0.1", "--port", str(ports["vllm"]),
        "--enforce-eager", "--max-model-len", "4096", "--dtype", "float32", "--seed", "0",
        "--max-num-seqs", "4", "--enable-prompt-tokens-details",
        "--kv-transfer-config", json.dumps(kv),
    ]  # fmt: skip


HEALTH = {"lmcache": "http://127.0.0.1:{lmcache_http}/healthcheck",
          "vllm": "http://127.0.0.1:{vllm}/health"}  # fmt: skip


def start(root: Path, state: dict, name: str, timeout_s: float = 240.0) -> None:
    import subprocess

    argv = state["argv"][name]
    log = open(root / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env(root), start_new_session=True
    )
    state["pids"][name] = proc.pid
    save(root, state)
    url = HEALTH[name].format(**state["ports"])
    deadline = time.monotonic() + timeout_s
    while not http_ok(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc.pid)
            sys.exit(f"{name} did not come up (rc {proc.poll()}); see {root / f'{name}.log'}")
        time.sleep(0.3)


def stop_group(pgid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the part's process group (it leads its own session), SIGKILL after a while."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            try:  # reap it if it is our child
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.1)


def shm_segments() -> set[str]:
    """vLLM's and LMCache's /dev/shm segments (lmcache_kv_* are 1 GiB each)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(("psm_", "lmcache_kv_"))}


def shm_mapped(name: str) -> bool:
    needle = f"/dev/shm/{name}"
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if needle in maps.read_text():
                return True
        except OSError:  # the process went away, or is not ours to read
            continue
    return False


def save(root: Path, state: dict) -> None:
    (root / "state.json").write_text(json.dumps(state, indent=2))


def load(root: Path) -> dict:
    return json.loads((root / "state.json").read_text())


def up(root: Path, model: str, module: bool, only_lmcache: bool) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    (root / "l2-fs").mkdir(exist_ok=True)
    ports = {k: free_port() for k in ("lmcache", "lmcache_http", "vllm")}
    state = {
        "ports": ports,
        "pids": {},
        "argv": {"lmcache": lmcache_argv(root, ports, module), "vllm": vllm_argv(model, ports)},
        "restarts": {"lmcache": 0, "vllm": 0},
        "shm_before": sorted(shm_segments()),
    }
    save(root, state)
    try:
        start(root, state, "lmcache", 120.0)
        if not only_lmcache:
            start(root, state, "vllm")
    except BaseException:
        down(root)
        raise
    return state


def restart(root: Path, name: str) -> None:
    state = load(root)
    stop_group(state["pids"][name])
    state["restarts"][name] += 1
    start(root, state, name)


def down(root: Path) -> None:
    """Stop every part, then remove the /dev/shm segments they left: a part stopped by
    SIGKILL (or a restarted one's old self) never unlinks its segment, as tooling must know."""
    state = load(root)
    for name in ("vllm", "lmcache"):
        pid = state["pids"].get(name)
        if pid:
            stop_group(pid)
    for seg in sorted(shm_segments() - set(state.get("shm_before", []))):
        if not shm_mapped(seg):
            (Path("/dev/shm") / seg).unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    cmd, root = argv[0], Path(argv[1])
    if cmd == "up":
        model = argv[argv.index("--model") + 1]
        state = up(root, model, "--no-module" not in argv, "--only-lmcache" in argv)
        print(json.dumps(state))
    elif cmd in ("restart-vllm", "restart-lmcache"):
        restart(root, cmd.split("-", 1)[1])
    elif cmd == "down":
        down(root)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
