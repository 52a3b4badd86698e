"""The server module's handlers over LMCache's real StorageManager, in process (no vLLM)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytest.importorskip("lmcache")

from bsr_inprocess import (  # noqa: E402
    C_BYTES,
    CHUNK,
    MODEL,
    VerifyingDestination,
    authed,
    make_tokens,
    restore,
)
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey  # noqa: E402

from bsrkv.lmcache_ext.bsr import extensions  # noqa: E402
from bsrkv.lmcache_ext.bsr.mp_storage import InstallRefused, MPBlockDestination  # noqa: E402
from bsrkv.lmcache_ext.bsr.protocol import (  # noqa: E402
    ConfigureReply,
    ForgetReply,
    MarkersReply,
    PeakReply,
    ProtocolError,
    ResetPeakReply,
    StatusReply,
)
from bsrkv.lmcache_ext.faults.control import (  # noqa: E402
    clear_fault_rules,
    fault_stats,
    set_fault_rules,
)
from bsrkv.restore.types import FailureKind, Window  # noqa: E402


def test_probe_only_lookup_counts_the_whole_prefix_and_stages_nothing(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    tokens = make_tokens(12)
    server.seed(tokens)
    assert server.l1_used() == 0
    assert server.lookup(tokens, "r-probe") == 12  # 12 chunks > L1's 8: still the full count
    assert server.l1_used() == 0
    status = server.module.status()
    assert status.counters["lookups_probe_only"] == 1
    assert status.l1_used_after_last_probe_bytes == 0
    server.module.free_lookup_locks(
        IPCCacheServerKey(MODEL, 1, None, tuple(tokens), 0, 12 * CHUNK, "r-probe"), 1
    )
    assert server.module.status().counters["free_lookup_locks_noop"] == 1


@pytest.mark.parametrize("w", [1, 2, 4])
def test_windows_restore_byte_exact_with_peak_exactly_w_chunks(bsr_sm_server, w: int) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=w)
    tokens = make_tokens(12, salt=w)
    payloads = server.seed(tokens)
    server.module.bsr_reset_peak(authed())
    dest = VerifyingDestination(payloads)
    outcome = restore(server, tokens, f"r-w{w}", dest)
    assert outcome.ok, outcome.detail
    assert dest.installed == list(range(12))
    peak = json.loads(server.module.bsr_peak(b""))
    assert peak["restore_pool_peak_bytes"] == w * C_BYTES
    assert peak["l1_used_peak_bytes"] == w * C_BYTES  # measured in L1, not computed
    assert server.l1_used() == 0  # every window released


def test_budget_2w_pipelines_two_windows_within_b(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2, admission_budget_chunks=4)
    tokens = make_tokens(12, salt=11)
    payloads = server.seed(tokens)
    server.module.bsr_reset_peak(authed())
    dest = VerifyingDestination(payloads)
    outcome = restore(server, tokens, "r-pipe", dest)
    assert outcome.ok, outcome.detail
    assert dest.installed == list(range(12))
    peak = json.loads(server.module.bsr_peak(b""))
    assert peak["restore_pool_peak_bytes"] == 4 * C_BYTES  # window j+1 staged with j
    assert 2 * C_BYTES <= peak["l1_used_peak_bytes"] <= 4 * C_BYTES
    status = server.module.status()
    assert status.effective_budget_chunks == 4 and status.budget_peak_in_use_chunks == 4
    assert server.l1_used() == 0


def test_dropped_key_in_window_k_fails_closed_and_forces_local(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    tokens = make_tokens(10, salt=3)
    payloads = server.seed(tokens)
    assert server.lookup(tokens, "r-fault") == 10
    # Real means: the L2 adapter drops the first key of its third load task (window 2).
    set_fault_rules([{"action": "drop", "tasks": [2], "positions": [0]}], server.fault_name)
    dest = VerifyingDestination(payloads)
    outcome = restore(server, tokens, "r-fault", dest)
    assert not outcome.ok and outcome.failure == FailureKind.MISSING_KEY
    assert outcome.cached_chunks == 0 and outcome.windows_done == 2
    assert dest.invalid
    assert server.l1_used() == 0
    assert fault_stats(server.fault_name)["dropped_keys"] == 1
    clear_fault_rules(server.fault_name)
    # Force-local: the next lookup of that request reports 0 until it is torn down.
    assert server.lookup(tokens, "r-fault") == 0
    assert server.module.status().counters["lookups_forced_local"] == 1
    server.module.end_session("r-fault")
    assert server.lookup(tokens, "r-fault") == 10
    events = [e["event"] for e in json.loads(server.module.bsr_markers(b""))["events"]]
    assert events == ["set", "forced_lookup", "cleared_teardown"]


def test_install_error_and_timeout_fail_closed(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2, window_timeout_s=0.5, drain_timeout_s=0.1)
    tokens = make_tokens(6, salt=5)
    payloads = server.seed(tokens)
    out = restore(server, tokens, "r-install", VerifyingDestination(payloads, fail_window=1))
    assert not out.ok and out.failure == FailureKind.INSTALL_ERROR and out.windows_done == 1
    assert server.l1_used() == 0
    set_fault_rules([{"action": "delay", "tasks": [1], "delay_s": 2.0}], server.fault_name)
    out = restore(server, tokens, "r-timeout", VerifyingDestination(payloads))
    assert not out.ok and out.failure == FailureKind.TIMEOUT and out.windows_done == 1
    deadline = time.monotonic() + 10  # the late window is drained in the background
    while server.l1_used() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.l1_used() == 0
    clear_fault_rules(server.fault_name)


def test_handlers_fail_closed_and_never_raise(bsr_sm_server, monkeypatch) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    m = server.module
    key = IPCCacheServerKey("not-registered", 1, None, tuple(range(40)), 0, 32, "r-x")
    m.lookup(key, 1)
    assert m.query_prefetch_status("r-x") == 0  # unregistered model: answered at once
    assert m.wait_prefetch_status("never-looked-up", 0.1) == 0
    wkey = IPCCacheServerKey("not-registered", 1, 0, tuple(range(40)), 0, 32, "r-x")
    assert m.retrieve(wkey, 12345, [[1, 2]], b"", 0) == (b"", False)
    assert m.store(wkey, 12345, [[1, 2]], b"") == (b"", False)
    m.free_lookup_locks(key, 1)
    m.end_session("r-x")
    # A storage that raises inside the probe: the lookup answers 0, nothing escapes.
    tokens = make_tokens(4, salt=9)
    server.seed(tokens)

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("storage exploded")

    monkeypatch.setattr(m.restorer.storage, "probe", boom)
    assert server.lookup(tokens, "r-boom") == 0
    monkeypatch.setattr(m, "_windowed_retrieve", boom)
    assert m.retrieve(wkey, 12345, [[1, 2]], b"", 0) == (b"", False)
    assert m.markers.record("r-x") is not None  # every failed retrieve forces local


def test_stall_guard_refuses_installs_after_a_process_stall() -> None:
    dest = MPBlockDestination(
        cache_context=None,
        event_backend=None,
        block_ids=[[1, 2]],
        chunk_tokens=CHUNK,
        skip_first_n_tokens=0,
        transfer_key="k",
        guard=lambda: "stalled 12.0s",
    )
    with pytest.raises(InstallRefused, match="stalled"):  # refused before any copy
        dest.install("r", Window(0, 0, 1), {}, 1)


def test_configure_switches_window_at_run_time(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    out = json.loads(server.module.bsr_configure(authed({"window_chunks": 4})))
    assert out["ok"] and server.module.window_chunks == 4
    out = json.loads(server.module.bsr_configure(authed({"admission_budget_chunks": 1})))
    assert not out["ok"] and "B >= W" in out["error"]
    assert server.module.window_chunks == 4


def test_configure_reads_its_request_strictly_naming_the_key(bsr_sm_server) -> None:
    # the typed ConfigureRequest: an unknown, launch-time or mistyped key changes nothing
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    what = "bsr.configure request"
    for body, error in (
        ({"window_chunk": 4}, f"{what}: missing keys [], unexpected keys ['window_chunk']"),
        ({"load_concurrency": 4}, f"{what}: missing keys [], unexpected keys ['load_concurrency']"),
        ({"window_chunks": "4"}, f"{what}.window_chunks: expected int, got '4'"),
        ({"readback": 1}, f"{what}.readback: expected bool, got 1"),
    ):
        out = ConfigureReply.from_json(json.loads(server.module.bsr_configure(authed(body))))
        assert (out.ok, out.error) == (False, error)
        assert server.module.window_chunks == 2
    out = json.loads(server.module.bsr_configure(authed({"window_staging": "prefetch"})))
    assert out["ok"] and out["config"]["window_staging"] == "prefetch"


def test_configure_is_refused_while_a_retrieve_is_inside_arestore(bsr_sm_server) -> None:
    # The in-flight count and the swap share the module lock: a retrieve that took the old
    # restorer keeps the swap out until it ends (else two budgets, B exceeded across them).
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    module = server.module
    old = module.restorer
    with module._lock:
        module._restoring = 1  # as retrieve() holds it between taking and leaving restore()
    out = json.loads(module.bsr_configure(authed({"window_chunks": 4})))
    assert not out["ok"] and out["error"] == "1 retrieve(s) in flight: retry when idle"
    assert module.restorer is old and module.window_chunks == 2
    with module._lock:
        module._restoring = 0
    out = json.loads(module.bsr_configure(authed({"window_chunks": 4})))
    assert out["ok"] and module.restorer is not old and module.window_chunks == 4


# ---- the bsr.* replies are the protocol's types ------------------------------------------

REPLY_TYPES = {
    "bsr_status": StatusReply,
    "bsr_peak": PeakReply,
    "bsr_reset_peak": ResetPeakReply,
    "bsr_forget": ForgetReply,
    "bsr_markers": MarkersReply,
}


def test_every_bsr_reply_parses_as_its_protocol_type_byte_for_byte(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    m = server.module
    toks = make_tokens(4, salt=21)
    server.seed(toks)
    assert server.lookup(toks, "r-proto") == 4
    outcome = restore(server, toks, "r-proto", VerifyingDestination([b""] * 4, fail_window=0))
    key = IPCCacheServerKey(MODEL, 1, 0, tuple(toks), 0, 4 * CHUNK, "r-proto")
    m._after_restore(key, outcome, time.monotonic() - 0.5)  # a failed windowed retrieve's
    for method, kind in REPLY_TYPES.items():
        raw = getattr(m, method)(authed() if method in ("bsr_reset_peak", "bsr_forget") else b"")
        parsed = kind.from_json(json.loads(raw))
        assert json.dumps(parsed.to_json(), sort_keys=True).encode() == raw, method
    for payload in ({"window_chunks": 4}, {"admission_budget_chunks": 1}):
        raw = m.bsr_configure(authed(payload))
        reply = ConfigureReply.from_json(json.loads(raw))
        assert json.dumps(reply.to_json(), sort_keys=True).encode() == raw
    assert not reply.ok and "B >= W" in (reply.error or "")
    status = StatusReply.from_json(json.loads(m.bsr_status(b"")))
    (last,) = status.recent_outcomes
    assert (last.mode, last.ok, last.failure) == ("bsr", False, "INSTALL_ERROR")
    assert last.windows_done == 0
    assert status.last_probe is not None and status.last_probe.chunks == 4
    assert status.counter("failures_install_error") == 1


def test_a_key_renamed_in_the_servers_output_fails_from_json(bsr_sm_server) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    raw = json.loads(server.module.bsr_status(b""))
    raw["peak"]["l1_used_peak"] = raw["peak"].pop("l1_used_peak_bytes")
    with pytest.raises(ProtocolError, match=r"missing keys \['l1_used_peak_bytes'\]"):
        StatusReply.from_json(raw)
    forget = json.loads(server.module.bsr_forget(authed()))
    forget["l1_after"] = forget.pop("l1_used_bytes_after")
    with pytest.raises(ProtocolError, match="unexpected keys"):
        ForgetReply.from_json(forget)


def test_bsr_fault_dispatches_through_the_extension_registry(bsr_sm_server, monkeypatch) -> None:
    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    listed = json.loads(server.module.bsr_fault(authed({"op": "list"})))
    assert listed["ok"] and server.fault_name in listed["names"]
    monkeypatch.setattr(extensions, "_handlers", {})  # no fault adapter in this process
    assert json.loads(server.module.bsr_fault(authed({"op": "list"}))) == {
        "ok": False,
        "error": "fault adapter unavailable: none loaded in this server process",
    }


def test_restore_s_runs_from_the_requests_first_lookup(bsr_sm_server, monkeypatch) -> None:
    """restore_s starts at the request's first lookup (vLLM may look up again while it
    waits), retrieve_s at its retrieve; a request whose lookup this server never saw falls
    back to the retrieve; the newest LOOKUPS_KEPT lookups are kept."""
    from bsrkv.lmcache_ext.server import state

    server = bsr_sm_server(8 * C_BYTES, window_chunks=2)
    m = server.module
    toks = make_tokens(4, salt=22)
    server.seed(toks)
    now = [100.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: now[0])
    assert server.lookup(toks, "r-span") == 4  # first lookup at t = 100
    now[0] = 101.0
    m._lookup_seen("r-span")  # asked again at t = 101: the first one stays
    outcome = restore(server, toks, "r-span", VerifyingDestination([b""] * 4))
    key = IPCCacheServerKey(MODEL, 1, 0, tuple(toks), 0, 4 * CHUNK, "r-span")
    now[0] = 102.5
    m._after_restore(key, outcome, 102.0)  # its retrieve began at t = 102
    other = IPCCacheServerKey(MODEL, 1, 0, tuple(toks), 0, 4 * CHUNK, "r-unseen")
    m._after_restore(other, outcome, 102.25)
    status = StatusReply.from_json(json.loads(m.bsr_status(b"")))
    seen, unseen = status.recent_outcomes[-2:]
    assert (seen.request_id, seen.restore_s, seen.retrieve_s) == ("r-span", 2.5, 0.5)
    assert (unseen.request_id, unseen.restore_s, unseen.retrieve_s) == ("r-unseen", 0.25, 0.25)
    for i in range(state.LOOKUPS_KEPT):
        m._lookup_seen(f"r-{i}")
    assert len(m._lookup_at) == state.LOOKUPS_KEPT and "r-span" not in m._lookup_at
