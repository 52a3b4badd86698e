"""An operator's own deployment, as a cluster's tooling would start it: vLLM + LMCache MP server
with the known-good command lines of docs/attach.md (its ``<!-- operator: NAME -->`` blocks,
read out of that page here: what the docs say is what runs), NOT bsrctl's stack code (nothing of
``bsrctl.stack`` is imported). Only ports, folders, the model and L1's size are this
machine's; LMCache's L2 is the page's stock ``fs`` adapter, or with ``--l2 faults`` the
page's fault-adapter variant (what failure cells need).

    python operator_stack.py up DIR --model MODEL [--no-module] [--only-lmcache]
    python operator_stack.py restart-vllm DIR [--without-env NAME]
    python operator_stack.py restart-lmcache DIR [--l2 stock|faults]
    python operator_stack.py down DIR

DIR/state.json holds every part's PID, process group, command line, environment and
endpoints. Each part runs in its own session (its process group is its PID) so that a
restart or `down` stops it with every child by that id; `up` and the restarts return once
the part answers (LMCache, once vLLM has registered its KV cache again).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
MARK = "BSRCTL_OPERATOR_DEPLOYMENT"  # in every part's environment: the test finds them by it
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


ATTACH_DOC = Path(__file__).parents[3] / "docs" / "attach.md"


def readme_block(name: str) -> list[str]:
    """The shell words of docs/attach.md's ``<!-- operator: NAME -->`` code block."""
    text = ATTACH_DOC.read_text()
    marker = f"<!-- operator: {name} -->"
    if marker not in text:
        sys.exit(f"docs/attach.md has no {marker} block")
    body = text.split(marker, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return shlex.split(body.replace("\\\n", " "))


def env(root: Path) -> dict[str, str]:
    """This machine's hygiene around the page's own variables: the mark the tests find
    parts by, no telemetry, no hub, loopback only, a private compile cache."""
    return {
        **os.environ,
        MARK: str(root),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
    }


def localize(words: list[str], root: Path, ports: dict[str, int], model: str, l2: str) -> list[str]:
    """The page's example ports, folders and model as this machine's (nothing else)."""
    subs = [
        ("5555", str(ports["lmcache"])), ("8080", str(ports["lmcache_http"])),
        ("8000", str(ports["vllm"])), ("/var/lib/lmcache/l2", str(root / f"l2-{l2}")),
        ("/var/lib/lmcache", str(root)), ("/models/llama", model),
    ]  # fmt: skip
    out = []
    for w in words:
        for old, new in subs:
            w = w.replace(old, new)
        out.append(w)
    return out


def command(name: str, root: Path, ports: dict[str, int], model: str, **how: object) -> dict:
    """docs/attach.md's command line `name` ("lmcache" | "vllm") for this machine: argv + env."""
    words = readme_block(name)
    variables = {}
    while "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        variables[key] = value
    if name == "lmcache":
        words[0] = str(VENV_BIN / "lmcache")
        words[words.index("--l1-size-gb") + 1] = repr(L1_GB)
        if how.get("l2") == "faults":  # the page's fault-adapter variant of --l2-adapter
            at = words.index("--l2-adapter")
            words[at : at + 2] = readme_block("lmcache-l2-faults")
        if not how.get("module", True):
            at = words.index("--server-module")
            del words[at : at + 2]
    else:
        words[0] = sys.executable
    l2 = "fs" if how.get("l2") == "faults" else "stock"
    return {"argv": localize(words, root, ports, model, l2), "env": variables}


HEALTH = {"lmcache": "http://127.0.0.1:{lmcache_http}/healthcheck",
          "vllm": "http://127.0.0.1:{vllm}/health"}  # fmt: skip


def start(root: Path, state: dict, name: str, timeout_s: float = 240.0) -> None:
    import subprocess

    argv = state["argv"][name]
    log = open(root / f"{name}.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**env(root), **state["env"][name]},
    )  # fmt: skip
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


def group_segments(pgid: int) -> set[str]:
    """The psm_*/lmcache_kv_* segments the part's process group maps or holds open: the
    segments this deployment made (another deployment's, beside it under `make test`, are
    never ours to count or remove)."""
    prefixes = ("/dev/shm/psm_", "/dev/shm/lmcache_kv_")
    found: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            paths = [
                ln.split()[5]
                for ln in (proc / "maps").read_text().splitlines()
                if len(ln.split()) >= 6
            ]
            paths += [str(fd.readlink()) for fd in (proc / "fd").iterdir()]
        except (OSError, ValueError, IndexError):  # gone, or not ours to read
            continue
        found |= {p.removeprefix("/dev/shm/") for p in paths if p.startswith(prefixes)}
    return found


def remember_segments(state: dict, name: str) -> None:
    """Before a part stops: what it made goes into the state (a SIGKILLed part, or a
    restarted one's old self, never unlinks its segment; `down` removes those)."""
    pid = state["pids"].get(name)
    if pid:
        state["segments"] = sorted(set(state.get("segments", [])) | group_segments(pid))


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
    for l2 in ("l2-stock", "l2-fs"):
        (root / l2).mkdir(exist_ok=True)
    ports = {k: free_port() for k in ("lmcache", "lmcache_http", "vllm")}
    parts = {
        "lmcache": command("lmcache", root, ports, model, module=module),
        "vllm": command("vllm", root, ports, model),
    }
    state = {
        "ports": ports,
        "pids": {},
        "model": model,
        "module": module,
        "argv": {n: c["argv"] for n, c in parts.items()},
        "env": {n: c["env"] for n, c in parts.items()},
        "restarts": {"lmcache": 0, "vllm": 0},
        "segments": [],
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


def restart(root: Path, name: str, l2: str | None = None, without_env: str | None = None) -> None:
    """Stop the part by its group, then start it again: with `l2`, LMCache with that L2 (the
    docs/attach.md's stock or fault-adapter line); with `without_env`, that variable dropped."""
    state = load(root)
    vllm_on = name == "lmcache" and bool(state["pids"].get("vllm"))
    if vllm_on:
        heartbeat_started(root, state)
    seen = unhealthy_reports(root)
    remember_segments(state, name)
    save(root, state)
    stop_group(state["pids"][name])
    if vllm_on:  # its connector re-registers only after a heartbeat saw the server down
        wait_unhealthy(root, seen)
    state["restarts"][name] += 1
    if l2 is not None:
        cmd = command(name, root, state["ports"], state["model"], module=state["module"], l2=l2)
        state["argv"][name] = cmd["argv"]
    if without_env is not None:
        state["env"][name].pop(without_env, None)
    start(root, state, name)
    save(root, state)
    if vllm_on:
        wait_registered(state)


UNHEALTHY = "LMCache server is unhealthy"  # vllm_multi_process_adapter.py:614
HEARTBEAT = "PeriodicThread lmcache-heartbeat entering main loop"


def heartbeat_started(root: Path, state: dict) -> None:
    """vLLM's worker starts its heartbeat (the one that re-registers) on its first KV store
    (vllm_multi_process_adapter.py:1682-1705, 1811): if none ran yet, one request whose
    prompt holds a whole chunk (256 tokens) makes it."""
    log = root / "vllm.log"
    if log.read_text(errors="replace").count(HEARTBEAT) >= 2:  # the scheduler's and the worker's
        return
    body = {"model": state["model"], "prompt": list(range(1, 300)), "max_tokens": 1}
    req = urllib.request.Request(
        "http://127.0.0.1:{vllm}/v1/completions".format(**state["ports"]),
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
    deadline = time.monotonic() + 30
    while log.read_text(errors="replace").count(HEARTBEAT) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)


def unhealthy_reports(root: Path) -> int:
    log = root / "vllm.log"
    return log.read_text(errors="replace").count(UNHEALTHY) if log.is_file() else 0


def wait_unhealthy(root: Path, seen: int, timeout_s: float = 60.0) -> None:
    """Until vLLM's heartbeat (every 10 s, lmcache.mp.heartbeat_interval) reports the server
    down: a server back before that is never noticed, and vLLM never registers with it."""
    # both heartbeats (the scheduler's and the worker's, which re-registers) must see it
    beats = min(2, (root / "vllm.log").read_text(errors="replace").count(HEARTBEAT))
    deadline = time.monotonic() + timeout_s
    while unhealthy_reports(root) < seen + max(1, beats):
        if time.monotonic() > deadline:
            sys.exit(f"vLLM's heartbeat did not report LMCache down within {timeout_s:g} s")
        time.sleep(0.5)


def wait_registered(state: dict, timeout_s: float = 90.0) -> None:
    """vLLM's connector registers its KV cache again with a restarted server on its heartbeat's
    unhealthy -> healthy edge (lmcache/integration/vllm/vllm_multi_process_adapter.py:
    553-600, 1627-1643)."""
    url = "http://127.0.0.1:{lmcache_http}/status".format(**state["ports"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if json.loads(r.read()).get("registered_gpu_ids"):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    sys.exit(f"vLLM did not register with the restarted LMCache within {timeout_s:g} s")


def down(root: Path) -> None:
    """Stop every part, then remove the /dev/shm segments they made and left: a part stopped
    by SIGKILL (or a restarted one's old self) never unlinks its segment, as tooling must
    know. Only this deployment's: its state lists them."""
    state = load(root)
    for name in ("vllm", "lmcache"):
        remember_segments(state, name)
    save(root, state)
    for name in ("vllm", "lmcache"):
        pid = state["pids"].get(name)
        if pid:
            stop_group(pid)
    for seg in state["segments"]:
        if not shm_mapped(seg):
            (Path("/dev/shm") / seg).unlink(missing_ok=True)


def main(argv: list[str]) -> None:
    cmd, root = argv[0], Path(argv[1])
    if cmd == "up":
        model = argv[argv.index("--model") + 1]
        state = up(root, model, "--no-module" not in argv, "--only-lmcache" in argv)
        print(json.dumps(state))
    elif cmd in ("restart-vllm", "restart-lmcache"):
        l2 = argv[argv.index("--l2") + 1] if "--l2" in argv else None
        drop = argv[argv.index("--without-env") + 1] if "--without-env" in argv else None
        restart(root, cmd.split("-", 1)[1], l2, drop)
    elif cmd == "down":
        down(root)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
