"""The typed bsr.* replies: every reply round-trips through JSON; a renamed key fails."""

from __future__ import annotations

import json
from typing import Any

import pytest
from msgspec.structs import asdict

from bsrkv.lmcache_ext.bsr.protocol import (
    SCHEMA,
    ConfigureReply,
    ForgetReply,
    LastProbe,
    MarkerEvent,
    MarkersReply,
    PeakReply,
    ProtocolError,
    ResetPeakReply,
    RestoreOutcomeSummary,
    StatusReply,
)

PEAK = PeakReply({0: 4096, 1: 2048}, 4096, {0: 0, 1: 0}, 4096, 0, 1 << 20)
STOCK = RestoreOutcomeSummary("r-1", 0, "stock", True, 0, 512, 0.25)
BSR = RestoreOutcomeSummary(
    "r-2", 1, "bsr", False, 0, 512, 1.5, "MISSING_KEY", "key 3 absent", 0, 2, 8192, {1: 4096}
)
STATUS = StatusReply(
    config={"window_chunks": 2, "window_timeout_s": 30.0},
    effective_window_chunks=2,
    effective_budget_chunks=2,
    budget_in_use_chunks=0,
    budget_peak_in_use_chunks=2,
    degraded="",
    counters={"lookups": 3, "retrieves_ok": 1},
    force_local_markers=1,
    force_local_events={"set": 1},
    l1_used_after_last_probe_bytes=0,
    last_probe=LastProbe("r-2", "m", 1, 512, 2),
    tracked_requests=2,
    peak=PEAK,
    recent_outcomes=(STOCK, BSR),
)
REPLIES: list[Any] = [
    PEAK,
    ResetPeakReply(PEAK, PeakReply({}, 0, {}, 0, 0, 1 << 20)),
    STOCK,
    BSR,
    STATUS,
    StatusReply(**{**asdict(STATUS), "last_probe": None, "recent_outcomes": ()}),
    MarkersReply(1, {"set": 1}, (MarkerEvent("r-2", "set", "MISSING_KEY: key 3", 1.5e9),)),
    ForgetReply(4096, 0, False, 0.12),
    ConfigureReply(True, {"window_chunks": 4}),
    ConfigureReply(False, {"window_chunks": 4}, "1 retrieve(s) in flight: retry when idle"),
]


def wire(reply: Any) -> Any:
    """What a client receives: the server's bytes (json.dumps, sorted keys), parsed."""
    return json.loads(json.dumps(reply.to_json(), sort_keys=True, default=str))


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_every_reply_round_trips(reply: Any) -> None:
    assert type(reply).from_json(wire(reply)) == reply


def test_the_wire_shape_is_what_the_clients_read() -> None:
    assert wire(PEAK)["restore_pool_peak_bytes_by_rank"] == {"0": 4096, "1": 2048}
    assert sorted(wire(STOCK)) == sorted(
        ["request_id", "rank", "mode", "ok", "start_token", "end_token", "restore_s"]
    )
    assert wire(BSR)["peak_staged_bytes_by_rank"] == {"1": 4096}
    status = wire(STATUS)
    assert status["schema"] == SCHEMA == "bsrkv.lmcache_ext/1"
    assert status["last_probe"]["chunks"] == 2
    assert wire(StatusReply(**{**asdict(STATUS), "last_probe": None}))["last_probe"] == {}
    assert "error" not in wire(ConfigureReply(True, {}))


def _renamed(raw: dict[str, Any], path: tuple[str, ...], new: str) -> dict[str, Any]:
    out = json.loads(json.dumps(raw))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[new] = node.pop(path[-1])
    return out


@pytest.mark.parametrize(
    ("reply", "path"),
    [
        (PEAK, ("restore_pool_peak_bytes",)),
        (STATUS, ("recent_outcomes", 1, "bytes_restored")),
        (STATUS, ("peak", "l1_used_peak_bytes")),
        (STATUS, ("counters",)),
        (MarkersReply(0, {}, (MarkerEvent("r", "set", "", 1.0),)), ("events", 0, "event")),
        (ForgetReply(1, 0, False, 0.0), ("l1_used_bytes_after",)),
        (ConfigureReply(False, {}, "no"), ("error",)),
    ],
)
def test_a_renamed_key_fails_instead_of_reading_as_absent(reply: Any, path: tuple) -> None:
    raw = wire(reply)
    with pytest.raises(ProtocolError, match="missing keys"):
        type(reply).from_json(_renamed(raw, path, f"{path[-1]}_v2"))


def test_mistyped_or_inconsistent_replies_fail() -> None:
    with pytest.raises(ProtocolError, match="expected int"):
        PeakReply.from_json({**wire(PEAK), "l1_used_bytes": "0"})
    with pytest.raises(ProtocolError, match="all present for mode bsr"):
        RestoreOutcomeSummary.from_json({**wire(STOCK), "mode": "bsr"})
    with pytest.raises(ProtocolError, match="this client reads"):
        StatusReply.from_json({**wire(STATUS), "schema": "bsrkv.lmcache_ext/0"})
    with pytest.raises(ProtocolError, match="error is set exactly when ok is false"):
        ConfigureReply.from_json({"ok": False, "config": {}})


def test_window_phases_travel_only_when_recorded() -> None:
    phases = (
        {"index": 0.0, "admit_wait_s": 0.0, "fetch_s": 0.01, "wait_s": 0.01}
        | {"install_s": 0.002, "sync_s": 0.0, "installed_at_s": 0.012},
    )
    timed = RestoreOutcomeSummary(**{**asdict(BSR), "window_phases": phases})
    assert "window_phases" not in wire(BSR)
    assert wire(timed)["window_phases"] == [dict(p) for p in phases]
    assert RestoreOutcomeSummary.from_json(wire(timed)) == timed
    with pytest.raises(ProtocolError, match="window_phases"):
        RestoreOutcomeSummary.from_json({**wire(BSR), "window_phases": [{"fetch_s": "x"}]})
