"""`stack.kind: attach` without any server: fields checked (exit 2), a dead endpoint is exit 3
in bounded time naming it, the --server-module line an operator adds is exact."""

from __future__ import annotations

import json
import shlex
import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.stack.attach.stack import host_port, server_module_line
from bsrkv.settings import RestoreSettings

SMOKE = Path(__file__).parents[3] / "ladders" / "cpu-smoke.yaml"
runner = CliRunner()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def attach_spec(tmp_path: Path, attach: str) -> Path:
    text = SMOKE.read_text().replace(
        "stack:\n  kind: serving\n", f"stack:\n  kind: attach\n{attach}"
    )
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def test_missing_attach_section_is_bad_input(tmp_path: Path) -> None:
    code, out = run("sweep", str(attach_spec(tmp_path, "")), "--out", str(tmp_path / "o"))
    assert code == 2, out
    assert "kind attach needs an `attach:` section" in out


@pytest.mark.parametrize(
    ("attach", "field"),
    [
        ("  attach:\n    vllm_url: http://127.0.0.1:1\n    lmcache_url: tcp://127.0.0.1:2\n"
         "    lmcache_http_port: many\n", "stack.attach.lmcache_http_port"),
        ("  attach:\n    vllm_url: http://127.0.0.1:1\n    lmcache_http_port: 3\n",
         "stack.attach.lmcache_url"),
        ("  attach:\n    vllm_url: 127.0.0.1:1\n    lmcache_url: tcp://127.0.0.1:2\n"
         "    lmcache_http_port: 3\n", "stack.attach.vllm_url"),
        ("  attach:\n    vllm_url: http://127.0.0.1:1\n    lmcache_url: tcp://127.0.0.1:2\n"
         "    lmcache_http_port: 3\n    commands: {restart_vlm: x}\n",
         "stack.attach.commands.restart_vlm"),
    ],
)  # fmt: skip
def test_wrong_or_missing_field_is_exit_2_naming_it(
    tmp_path: Path, attach: str, field: str
) -> None:
    code, out = run("sweep", str(attach_spec(tmp_path, attach)), "--out", str(tmp_path / "o"))
    assert code == 2, out
    assert field in out, out


@pytest.mark.parametrize("dead", ["vllm", "lmcache_http"])
def test_dead_endpoint_is_exit_3_in_bounded_time_naming_it(tmp_path: Path, dead: str) -> None:
    # vLLM answering is faked by nothing: the first endpoint probed is vLLM, so for the LMCache
    # case vLLM's URL must answer /health: serve one on a thread.
    import http.server
    import threading

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        vllm = closed_port() if dead == "vllm" else srv.server_address[1]
        attach = (
            f"  attach:\n    vllm_url: http://127.0.0.1:{vllm}\n"
            f"    lmcache_url: tcp://127.0.0.1:{closed_port()}\n"
            f"    lmcache_http_port: {closed_port()}\n    connect_timeout_s: 2\n"
        )
        t0 = time.monotonic()
        code, out = run("sweep", str(attach_spec(tmp_path, attach)), "--out", str(tmp_path / "o"))
        took = time.monotonic() - t0
    finally:
        srv.shutdown()
    assert code == 3, out
    field = {"vllm": "stack.attach.vllm_url", "lmcache_http": "stack.attach.lmcache_http_port"}
    assert field[dead] in out, out
    assert "did not answer within 2 s" in out
    assert took < 30, took


def test_server_module_line_is_the_exact_argument() -> None:
    line = server_module_line(RestoreSettings(window_chunks=2))
    flag, arg = shlex.split(line)
    assert flag == "--server-module"
    doc = json.loads(arg)
    assert doc["module_path"] == "bsrkv.lmcache_ext.server"
    assert doc["factory_name"] == "build_server_modules"
    assert doc["config"]["window_chunks"] == 2
    assert doc["config"]["admission_budget_chunks"] == 2


def test_host_port() -> None:
    assert host_port("tcp://10.0.0.1:5555") == ("10.0.0.1", 5555)
    assert host_port("http://h:80/") == ("h", 80)
    assert host_port("198.18.0.2:50051") == ("198.18.0.2", 50051)


@pytest.mark.parametrize("command", ["ladder", "roundtrip", "stack-up"])
def test_commands_that_launch_refuse_attach(tmp_path: Path, command: str) -> None:
    attach = (
        "  attach:\n    vllm_url: http://127.0.0.1:1\n    lmcache_url: tcp://127.0.0.1:2\n"
        "    lmcache_http_port: 3\n"
    )
    path = attach_spec(tmp_path, attach)
    if command == "roundtrip":
        path.write_text(
            "stack:\n  kind: attach\n" + attach + "prompt_tokens: 1024\ntiers: [l1, fs]\n"
        )
    args = ["stack", "up", str(path)] if command == "stack-up" else [command, str(path)]
    code, out = run(*args, "--out" if command != "stack-up" else "--run-dir", str(tmp_path / "o"))
    assert code == 2, out
    assert "attach" in out


def attached_stack(tmp_path: Path, adapters: list[dict]):
    from bsrctl.specs import StackSpec
    from bsrctl.stack.attach.stack import AttachedStack

    spec = StackSpec.model_validate({
        "kind": "attach",
        "attach": {"vllm_url": "http://127.0.0.1:1", "lmcache_url": "tcp://127.0.0.1:2",
                   "lmcache_http_port": 3},
    })  # fmt: skip
    st = AttachedStack(spec, tmp_path)
    st.lmcache_status = lambda: {"storage_manager": {"l2_adapters": adapters}}  # type: ignore[method-assign]
    st._model_name = "/models/tiny"
    return st


STOCK_FS = {"type": "FSL2Adapter", "base_path": "/l2", "use_odirect": False}
WRAPPED_MOONCAKE = {"type": "BsrFaultL2Adapter", "bsr_fault": {"name": "mooncake"}}


def test_lmcache_stock_fs_adapter_is_the_fs_tier(tmp_path: Path) -> None:
    st = attached_stack(tmp_path, [WRAPPED_MOONCAKE, STOCK_FS])
    assert st.tier_names() == ["mooncake", "fs"]  # the server's order
    assert st.tiers() == ["fs", "mooncake"]  # FS first


def test_seeding_reads_each_tier_by_a_lookup_through_the_server(tmp_path: Path) -> None:
    from bsrctl.stack.measure.tiers import chunks_held
    from bsrkv.lmcache_ext.bsr.protocol import HoldsReply

    st = attached_stack(tmp_path, [STOCK_FS, WRAPPED_MOONCAKE])
    calls: list[tuple] = []

    class Bsr:
        def holds(self, ids: list[int], model: str, world: int) -> HoldsReply:
            calls.append((len(ids), model, world))
            return HoldsReply(8, (8, 3), "")

    ids = list(range(2048))
    assert chunks_held(st, ids, [], "fs") == 0  # not connected yet: nothing looked up
    st.bsr = Bsr()
    assert chunks_held(st, ids, [], "fs", ranks=2) == 8  # no file name is read
    assert chunks_held(st, ids, [], "mooncake") == 3
    assert chunks_held(st, ids, [], "ssd") == 0
    assert calls == [
        (2048, "/models/tiny", 2),
        (2048, "/models/tiny", 1),
        (2048, "/models/tiny", 1),
    ]


def test_the_console_shows_the_attached_servers_l1_not_the_specs(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from bsrctl.specs import TargetSpec
    from bsrctl.stack.measure.target import RunningTarget

    spec = TargetSpec()
    attached = SimpleNamespace(kind="attach", l1_capacity_bytes=64 << 20)
    assert RunningTarget(spec, tmp_path, attached).l1_bytes(1 << 30) == 64 << 20
    launched = SimpleNamespace(kind="serving")  # builds L1 as asked
    assert RunningTarget(spec, tmp_path, launched).l1_bytes(1 << 30) == 1 << 30
