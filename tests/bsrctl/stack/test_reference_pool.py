"""The reference pool: one kept reference per launch, found again by PID and start time,
the least recently used idle one stopped to make room, all stopped by PID at close."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bsrctl.specs import load_stack_section
from bsrctl.stack.launch.process import Supervised, free_port, http_ok, pids_alive
from bsrctl.stack.launch.serving.state import start_times, write_state
from bsrctl.stack.measure import reference_pool as rp

SMOKE = Path(__file__).parents[3] / "ladders" / "cpu-smoke.yaml"

# A stand-in reference: answers GET /health with 200 on the port it is given.
HEALTH = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_key_ignores_port_and_folders_and_follows_every_launch_setting() -> None:
    spec, _ = load_stack_section(SMOKE)
    model = Path("/models/tiny-llama-4ef3a65b45b35ef3")
    key = rp.launch_key(spec, model)
    assert key == rp.launch_key(spec.model_copy(), model) and len(key) == 20
    other = {
        "max_model_len": 8192,
        "dtype": "bfloat16",
        "tensor_parallel_size": 2,
        "max_num_seqs": 3,
        "kvcache_space_gib": 2,
    }
    keys = {key}
    for field, value in other.items():
        changed = spec.model_copy(update={"vllm": spec.vllm.model_copy(update={field: value})})
        keys.add(rp.launch_key(changed, model))
    keys.add(rp.launch_key(spec, model.with_name("tiny-llama-0000000000000000")))
    assert len(keys) == 2 + len(other)  # each setting (and another model) its own reference
    # what the launch ignores shares one: the request timeout is the client's
    slower = spec.model_copy(
        update={"vllm": spec.vllm.model_copy(update={"request_timeout_s": 999})}
    )
    assert rp.launch_key(slower, model) == key


@pytest.fixture
def references(tmp_path: Path) -> Iterator:
    """start(key) -> (part, port): a /health server recorded as ``key``'s reference the way
    PlainVllm's up records itself (stack/state.json); every one stopped by PID after."""
    started: list[Supervised] = []
    pool = tmp_path / "pool"

    def start(key: str) -> tuple[Supervised, int]:
        port = free_port()
        stack = pool / key / "stack"
        part = Supervised("vllm-reference", [sys.executable, "-c", HEALTH, str(port)],
                          stack / "vllm-reference.log")  # fmt: skip
        part.start()
        started.append(part)
        deadline = time.monotonic() + 20
        while not http_ok(f"http://127.0.0.1:{port}/health") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert part.pid is not None
        write_state(stack, {
            "ports": {"vllm.port": port},
            "parts": {"vllm": {"pid": part.pid, "children": []}},
            "pid_start_times": start_times([part.pid]),
        })  # fmt: skip
        (pool / key / "used").touch()
        return part, port

    yield pool, start
    for part in started:
        part.stop(timeout_s=2)


def test_a_live_reference_is_found_again_and_closing_stops_it_by_pid(references) -> None:
    pool, start = references
    part, port = start("k1")
    with rp.held(pool, "k1") as (entry, found):
        assert (entry, found) == (pool / "k1", port)
    assert rp.close_pool(pool) == []
    assert pids_alive([part.pid]) == []
    with rp.held(pool, "k1") as (_, found):
        assert found is None  # gone: the next run starts its own


def test_a_reused_pid_is_never_taken_for_the_reference(references) -> None:
    pool, start = references
    part, port = start("k1")
    state = pool / "k1" / "stack" / "state.json"
    doc = json.loads(state.read_text())
    doc["pid_start_times"] = {str(part.pid): doc["pid_start_times"][str(part.pid)] - 100.0}
    state.write_text(json.dumps(doc))  # the PID another process's now
    with rp.held(pool, "k1") as (_, found):
        assert found is None
    assert pids_alive([part.pid]) == [part.pid]  # not ours by its start time: not signalled


def test_the_least_recently_used_idle_reference_makes_room(references) -> None:
    pool, start = references
    parts = {}
    for i in range(rp.POOL_SIZE):
        parts[f"k{i}"], _ = start(f"k{i}")
        os.utime(pool / f"k{i}" / "used", (1000 + i, 1000 + i))  # k0 the least recent
    with rp._locked(pool / "k0.lock"):  # k0 in use by another run: it stays
        with rp.held(pool, "new") as (_, found):
            assert found is None
    assert [p.name for p in rp.entries(pool)][-1] == "new"
    alive = {k for k, p in parts.items() if pids_alive([p.pid])}
    assert alive == {"k0", *(f"k{i}" for i in range(2, rp.POOL_SIZE))}  # k1 stopped
    assert rp.close_pool(pool) == []
    assert pids_alive([p.pid for p in parts.values()]) == []


def test_no_variable_no_pool(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(rp.POOL_ENV, raising=False)
    assert rp.pool_dir() is None
    monkeypatch.setenv(rp.POOL_ENV, str(tmp_path))
    assert rp.pool_dir() == tmp_path


def test_canonical_uses_the_pool_on_cpu_only(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Where the reference runs: the pool's entry on cpu, the run's own on cuda (the reference
    and the deployment never hold the GPUs at once), and the run's own without a pool."""
    from bsrctl.stack.launch.model import PreparedModel
    from bsrctl.stack.measure import canonical_outputs as canonical

    model = PreparedModel(tmp_path / "tiny-llama-1234", 512, "ab" * 32)
    monkeypatch.setattr(canonical, "prepare_model", lambda _v: model)
    ups: list[tuple[str, Path]] = []
    monkeypatch.setattr(canonical.PlainVllm, "up", lambda self: ups.append(("up", self.dir)))
    monkeypatch.setattr(canonical.PlainVllm, "down", lambda self: ups.append(("down", self.dir)))
    spec, _ = load_stack_section(SMOKE)
    pool, run = tmp_path / "pool", tmp_path / "run"
    monkeypatch.setenv(rp.POOL_ENV, str(pool))
    with canonical._reference(spec, run):
        pass
    key = rp.launch_key(spec, model.folder)
    assert ups == [("up", pool / key / "stack")]  # kept: no down
    ups.clear()
    with canonical._reference(spec.model_copy(update={"device": "cuda"}), run):
        pass
    assert ups == [("up", run / "canonical" / "stack"), ("down", run / "canonical" / "stack")]
    ups.clear()
    monkeypatch.delenv(rp.POOL_ENV)
    with canonical._reference(spec, run):
        pass
    assert ups == [("up", run / "canonical" / "stack"), ("down", run / "canonical" / "stack")]
