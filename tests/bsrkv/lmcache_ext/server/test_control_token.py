"""The control surface closed: the server module's mutating methods run only for a caller
holding the operator's control token (``bsrkv.control_token``), read-only ones answer
anyone. In process, over LMCache's real StorageManager: every handler the module registers
(as LMCache discovers them) is classified; a refused call leaves L1, W, the peak, the fault
rules and TempoKV exactly as they were."""

from __future__ import annotations

import hmac
import json
from typing import Any

import pytest

pytest.importorskip("lmcache")

import torch  # noqa: E402
from bsr_inprocess import C_BYTES, LAYOUT, TOKEN, authed, make_tokens  # noqa: E402
from lmcache.v1.multiprocess.ext_server_module import iter_server_module_handlers  # noqa: E402

from bsrkv import control_token  # noqa: E402
from bsrkv.control_token import MUTATING, READ_ONLY  # noqa: E402
from bsrkv.lmcache_ext.bsr.protocol import RefusedReply  # noqa: E402
from bsrkv.lmcache_ext.faults.control import fault_stats  # noqa: E402
from bsrkv.lmcache_ext.server.guard import GUARDED  # noqa: E402
from bsrkv.tempokv import wire  # noqa: E402

WRONG_SAME_LENGTH = "x" * len(TOKEN)
WRONG_OTHER_LENGTH = "short"
RULE = {"action": "drop", "phase": "load"}


def handlers(server) -> dict[str, Any]:
    return {h.method: h.handler for h in iter_server_module_handlers(server.module)}


def fill_l1(server, n: int = 3) -> int:
    """n chunks written into L1 and left there; L1's usage after."""
    for key in server.keys_for(make_tokens(n, salt=77)):
        obj = server.sm.reserve_write([key], LAYOUT)[key]
        obj.raw_tensor.view(torch.uint8).fill_(7)
        server.sm.finish_write([key])
    used = server.l1_used()
    assert used >= n * C_BYTES
    return used


def tempo_config() -> dict[str, Any]:
    cfg = wire.TempoConfig("immediate", 8 * C_BYTES, 4 * C_BYTES, 1, 1e9, 0.0, None, 0.05, 16)
    return wire.ConfigureRequest(cfg).to_json()


def mutating_calls(server) -> dict[str, bytes]:
    """One payload per mutating method that would change something if it ran."""
    update = wire.UpdateRequest(0.0, (), ("r-x",), ("r-x",), {}, {})
    return {
        "bsr.configure": {"window_chunks": 4},
        "bsr.forget": {"force": True},
        "bsr.reset_peak": {},
        "bsr.fault": {"op": "set", "name": server.fault_name, "rules": [RULE]},
        "tempokv.configure": tempo_config(),
        "tempokv.update": update.to_json(),
    }


def snapshot(server) -> dict[str, Any]:
    m = server.module
    return {
        "l1_used": server.l1_used(),
        "window_chunks": m.window_chunks,
        "config": m.config.model_dump(),
        "restorer": id(m.restorer),
        "peak": m.peak().to_json(),
        "counters": dict(m.status().counters),
        "fault_rules": fault_stats(server.fault_name)["rules"],
        "tempo": m.tempokv.live,
    }


def test_every_registered_handler_is_mutating_and_guarded_or_read_only(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    found = handlers(server)
    assert set(found) == MUTATING | READ_ONLY  # none unclassified, none missing
    assert not MUTATING & READ_ONLY
    for method, handler in found.items():
        assert getattr(handler, GUARDED, None) == (method if method in MUTATING else None)


@pytest.mark.parametrize(
    ("server_token", "given"),
    [
        (TOKEN, None),  # a client without the token
        (TOKEN, WRONG_SAME_LENGTH),
        (TOKEN, WRONG_OTHER_LENGTH),
        (None, TOKEN),  # no token configured on the server: closed whatever is sent
        (None, None),
    ],
    ids=["no-token", "wrong-same-length", "wrong-other-length", "server-none", "both-none"],
)
def test_a_refused_call_changes_nothing(bsr_sm_server, server_token, given) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2, control_token=server_token)
    used = fill_l1(server)
    before = snapshot(server)
    assert before["l1_used"] == used and before["window_chunks"] == 2
    assert before["fault_rules"] == 0 and before["tempo"] is None
    calls = handlers(server)
    for method, body in mutating_calls(server).items():
        payload = {**body, **({"control_token": given} if given is not None else {})}
        raw = json.loads(calls[method](json.dumps(payload).encode()))
        reply = RefusedReply.from_json(raw)
        assert (reply.ok, reply.method, reply.refused) == (False, method, "control token")
        assert reply.error.startswith(f"{method}: refused: ")
        if server_token is None:
            assert "no control token is configured on this server" in reply.error
        else:
            assert reply.error.endswith("required" if given is None else "wrong")
    after = snapshot(server)
    assert after == before  # L1 bytes, W, config, restorer, peak, counters, rules, TempoKV
    assert after["l1_used"] == used and after["window_chunks"] == 2


def test_the_right_token_runs_every_mutating_method(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    fill_l1(server)
    calls = handlers(server)
    out = json.loads(calls["bsr.configure"](authed({"window_chunks": 4})))
    assert out["ok"] and server.module.window_chunks == 4
    out = json.loads(calls["bsr.forget"](authed({"force": True})))
    assert out["l1_used_bytes_after"] == 0 and server.l1_used() == 0
    out = json.loads(calls["bsr.fault"](authed(mutating_calls(server)["bsr.fault"])))
    assert out["ok"] and fault_stats(server.fault_name)["rules"] == 1
    assert json.loads(calls["bsr.reset_peak"](authed()))["after"]["l1_used_bytes"] == 0
    out = json.loads(calls["tempokv.configure"](authed(tempo_config())))
    assert out["ok"] and server.module.tempokv.live is not None
    update = wire.UpdateRequest(0.0, (), (), (), {}, {}).to_json()
    assert not wire.UpdateReply.from_json(json.loads(calls["tempokv.update"](authed(update)))).off
    json.loads(calls["tempokv.configure"](authed({"config": None})))  # off again


def test_read_only_methods_answer_without_a_token(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2, control_token=None)
    calls = handlers(server)
    holds = {"model_name": "bsr-unit-model", "token_ids": make_tokens(2)}
    for method in sorted(READ_ONLY):
        raw = json.loads(calls[method](json.dumps(holds if method == "bsr.holds" else {}).encode()))
        assert not RefusedReply.is_refusal(raw), (method, raw)
    assert json.loads(calls["bsr.status"](b""))["effective_window_chunks"] == 2


def test_the_comparison_is_hmac_compare_digest_for_both_wrong_lengths(
    bsr_sm_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(control_token.hmac, "compare_digest", spy)
    configure = handlers(server)["bsr.configure"]
    for wrong in (WRONG_SAME_LENGTH, WRONG_OTHER_LENGTH):
        raw = json.loads(configure(authed({"window_chunks": 4}, token=wrong)))
        assert RefusedReply.from_json(raw).error.endswith("control token wrong")
    assert seen == [(TOKEN.encode(), WRONG_SAME_LENGTH.encode()),
                    (TOKEN.encode(), WRONG_OTHER_LENGTH.encode())]  # fmt: skip
    assert server.module.window_chunks == 2
    assert json.loads(configure(authed({"window_chunks": 4})))["ok"]
    assert seen[-1] == (TOKEN.encode(), TOKEN.encode())


def test_the_token_is_no_setting(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    status = json.loads(handlers(server)["bsr.status"](b""))
    assert "control_token" not in status["config"] and TOKEN not in json.dumps(status)


def test_the_token_from_the_servers_environment(
    bsr_sm_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one server per test: LMCache names its L1 pool by PID (two would share it)
    monkeypatch.setenv("BSRKV_CONTROL_TOKEN", "from-env")
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2, control_token=None)
    configure = handlers(server)["bsr.configure"]
    assert RefusedReply.is_refusal(json.loads(configure(authed({"window_chunks": 4}))))
    assert json.loads(configure(authed({"window_chunks": 4}, "from-env")))["ok"]
    assert server.module.window_chunks == 4


def test_where_the_server_takes_its_token_from() -> None:
    assert control_token.server_token("cfg", None) == "cfg"
    assert control_token.server_token(None, "env") == "env"
    assert control_token.server_token("same", "same") == "same"
    assert control_token.server_token("", "") is None  # empty is unset: closed
    with pytest.raises(ValueError, match="differ"):  # the module then refuses to load
        control_token.server_token("other", "env")
    with pytest.raises(ValueError, match="must be a string"):
        control_token.server_token(5, None)


def test_a_payload_that_is_not_an_object_is_refused_not_raised(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    for raw in (b"[1]", b"not json", b'{"control_token": 5}'):
        reply = RefusedReply.from_json(json.loads(handlers(server)["bsr.forget"](raw)))
        assert reply.method == "bsr.forget" and "control token" in reply.error
