"""How the control token flows: a launched stack draws its own and gives it to LMCache (and
TempoKV's vLLM) in the environment, never on a command line; bsrctl's bsr.* client sends it
on mutating calls only; an attached stack reads it from the variable the spec names; a
refusal is a StackFailed (exit 3) naming that variable; the fault control file is 0600."""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from bsrctl.errors import StackFailed
from bsrctl.spec_io import read_yaml
from bsrctl.specs import StackSpec, TargetSpec
from bsrctl.stack.attach.stack import AttachedStack
from bsrctl.stack.contracts.bsr_client import BsrModuleClient
from bsrctl.stack.launch.extensions import TempoKVLaunch, bsr_extensions
from bsrctl.stack.launch.serving.commands import Slots, lmcache_launch, vllm_launch
from bsrkv.lmcache_ext.bsr.protocol import ConfigureRequest
from bsrkv.lmcache_ext.faults.control import write_control_file
from bsrkv.tempokv.live import AdapterSettings

ROOT = Path(__file__).resolve().parents[3]


class Resp:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.success, self.payload, self.error = True, json.dumps(payload).encode(), ""


class FakeRequests:
    """server_module_call recorded, answered with ``reply``."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def server_module_call(self, req: Any) -> Future:
        self.sent.append((req.method, json.loads(req.payload)))
        fut: Future = Future()
        fut.set_result(Resp(self.reply))
        return fut


class Stack:
    parts: dict[str, Any] = {}

    def __init__(self, token: str | None, source: str = "the launched stack's own token"):
        self.control_token, self.control_token_source = token, source


def client(stack: Any, reply: dict[str, Any]) -> tuple[BsrModuleClient, FakeRequests]:
    pytest.importorskip("lmcache")
    c = BsrModuleClient(stack)
    fake = FakeRequests(reply)
    c._client = fake
    return c, fake


def test_mutating_calls_carry_the_token_read_only_ones_do_not() -> None:
    c, fake = client(Stack("tok"), {"ok": True})
    c.call("bsr.configure", {"window_chunks": 4})
    c.call("bsr.status")
    c.call("tempokv.configure", {"config": None})
    assert fake.sent == [
        ("bsr.configure", {"window_chunks": 4, "control_token": "tok"}),
        ("bsr.status", {}),
        ("tempokv.configure", {"config": None, "control_token": "tok"}),
    ]


def test_a_refusal_is_stack_failed_naming_the_variable() -> None:
    refused = {"ok": False, "method": "bsr.configure", "refused": "control token",
               "error": "bsr.configure: refused: control token wrong"}  # fmt: skip
    c, _ = client(Stack("bad", "$OPS_TOKEN (stack.attach.control_token_env)"), refused)
    with pytest.raises(StackFailed) as exc:
        c.configure(ConfigureRequest(window_chunks=4))
    assert exc.value.exit_code == 3
    msg = str(exc.value)
    assert "bsr.configure: refused: control token wrong" in msg
    assert "$OPS_TOKEN (stack.attach.control_token_env)" in msg


def attached(env: str | None) -> AttachedStack:
    at = {"vllm_url": "http://127.0.0.1:1", "lmcache_url": "tcp://127.0.0.1:2",
          "lmcache_http_port": 3, **({"control_token_env": env} if env else {})}  # fmt: skip
    return AttachedStack(StackSpec.model_validate({"kind": "attach", "attach": at}), Path("."))


def test_an_attached_stack_reads_the_token_from_the_named_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPS_TOKEN", "secret")
    st = attached("OPS_TOKEN")
    assert st.control_token == "secret"
    assert st.control_token_source == "$OPS_TOKEN (stack.attach.control_token_env)"
    monkeypatch.setenv("OPS_TOKEN", "")
    assert st.control_token is None  # empty is unset
    assert attached(None).control_token is None


def test_the_spec_field_is_a_variable_name() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="control_token_env"):
        attached("not a name")


def test_a_launched_stacks_token_is_in_the_environment_never_on_a_command_line(
    tmp_path: Path,
) -> None:
    doc = read_yaml(ROOT / "ladders" / "cpu-e1.yaml")
    spec = TargetSpec.model_validate({k: doc[k] for k in ("stack", "restore") if k in doc})
    ext = bsr_extensions(spec.settings(0))
    ports = {"lmcache.port": 1, "lmcache.http_port": 2, "vllm.port": 3}
    slots = Slots(ports, tmp_path, tmp_path / "model", control_token="t0k3n")
    lm = lmcache_launch(spec.stack, ext, slots, 1 << 30)
    assert lm.env["BSRKV_CONTROL_TOKEN"] == "t0k3n"
    assert not [a for a in lm.argv if "t0k3n" in a]
    plain = vllm_launch(spec.stack, ext, slots)
    assert "BSRKV_CONTROL_TOKEN" not in plain.env  # vLLM calls no mutating method
    from dataclasses import replace

    tk = replace(ext, tempokv=TempoKVLaunch(AdapterSettings()))
    tempo = vllm_launch(spec.stack, tk, slots)
    assert tempo.env["BSRKV_CONTROL_TOKEN"] == "t0k3n"  # its tempokv.update is mutating
    assert not [a for a in tempo.argv if "t0k3n" in a]


def test_the_fault_control_file_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "faults-fs.json"
    path.write_text('{"rules": []}')
    path.chmod(0o666)  # an older, wider file is replaced, not kept
    old = os.umask(0)
    try:
        write_control_file(path, [{"action": "drop", "phase": "load"}])
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"rules": [{"action": "drop", "phase": "load"}]}
    assert [p.name for p in tmp_path.iterdir()] == ["faults-fs.json"]  # no temp file left
