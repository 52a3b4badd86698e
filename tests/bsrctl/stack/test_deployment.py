"""The one serving Deployment, without a process: the follow-up health check, what a
deployment sets over bsr.configure, the launched deployment's folders, extensions and module
check (``ServingStack.up`` replaced), the attached one's configure-and-give-back against a
fake bsr.* client, and the stack selector."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bsrctl.errors import BadInput, StackFailed
from bsrctl.specs import AttachSpec, LmcacheSpec, StackSpec, TargetSpec
from bsrctl.stack.contracts.deployment import TIMEOUTS, FollowUp, configure_request, follow_up
from bsrctl.stack.deployments import attached, launched
from bsrctl.stack.launch.extensions import ServerModule
from bsrctl.stack.selector import make_deployment, make_target
from bsrkv.lmcache_ext.bsr.protocol import ConfigureRequest
from bsrkv.settings import RestoreSettings, RestoreTuning

TUNING = RestoreTuning()
ATTACH = AttachSpec(
    vllm_url="http://127.0.0.1:9", lmcache_url="tcp://127.0.0.1:10", lmcache_http_port=11
)


class FakeServing:
    """What follow_up reads of a stack: one completion and every part's health."""

    def __init__(self, out: tuple[int, ...], parts: dict[str, bool], fail: bool = False):
        self.out, self.parts, self.fail = out, parts, fail
        self.calls: list[tuple[int, int]] = []

    def complete(self, ids: list[int], max_tokens: int) -> Any:
        self.calls.append((len(ids), max_tokens))
        if self.fail:
            raise StackFailed("vLLM gone")
        return SimpleNamespace(output_token_ids=self.out, ttft_s=0.25)

    def health(self) -> dict[str, Any]:
        return {n: {"healthy": ok} for n, ok in self.parts.items()}


class FakeClient:
    """A bsr.* client: the module's config, the calls it got."""

    def __init__(self, config: dict[str, Any] | None = None, degraded: str = "") -> None:
        self.config = dict(config or {})
        self.degraded = degraded
        self.calls: list[Any] = []
        self.refuse = False

    def status(self) -> Any:
        self.calls.append("status")
        return SimpleNamespace(config=dict(self.config), degraded=self.degraded)

    def registration(self) -> Any:
        self.calls.append("registration")
        return SimpleNamespace(registrations=())

    def configure(self, request: ConfigureRequest) -> None:
        if self.refuse:
            raise StackFailed("gone")
        config = request.changes()
        self.calls.append(("configure", config))
        self.config.update(config)

    def close(self) -> None:
        self.calls.append("close")


# ---- the follow-up health check ------------------------------------------------------------


def test_follow_up_answers_in_full_with_every_part_healthy() -> None:
    st = FakeServing((1, 2, 3, 4), {"vllm": True, "lmcache": True})
    assert follow_up(st, list(range(100)), 4) == FollowUp(
        True, "follow-up returned 4/4 tokens; unhealthy parts: none"
    )
    assert st.calls == [(100, 4)]


def test_follow_up_short_answer_or_unhealthy_part_fails_naming_it() -> None:
    short = FakeServing((1, 2), {"vllm": True})
    assert follow_up(short, [1], 4) == FollowUp(
        False, "follow-up returned 2/4 tokens; unhealthy parts: none"
    )
    sick = FakeServing((1, 2, 3, 4), {"vllm": True, "mooncake-master": False, "lmcache": False})
    assert follow_up(sick, [1], 4) == FollowUp(
        False, "follow-up returned 4/4 tokens; unhealthy parts: ['lmcache', 'mooncake-master']"
    )
    gone = FakeServing((), {}, fail=True)
    assert follow_up(gone, [1], 4) == FollowUp(False, "follow-up request failed: vLLM gone")


def test_follow_up_against_the_canonical_output() -> None:
    st = FakeServing((5, 6, 7), {"vllm": True})
    assert follow_up(st, [1], 8, canonical=(5, 6, 7)) == FollowUp(
        True, "follow-up returned 3/8 tokens (canonical) in 0.25 s; unhealthy parts: none"
    )
    assert follow_up(st, [1], 8, canonical=(5, 6, 8)) == FollowUp(
        False, "follow-up returned 3/8 tokens (NOT canonical) in 0.25 s; unhealthy parts: none"
    )


def test_the_configure_request_is_w_b_and_every_timeout() -> None:
    s = RestoreSettings.of(TUNING, 4)
    got = configure_request(s).changes()
    assert list(got) == ["window_chunks", "admission_budget_chunks", *TIMEOUTS]
    assert (got["window_chunks"], got["admission_budget_chunks"]) == (4, 4)  # B = W unset
    assert configure_request(RestoreSettings.of(TUNING, 4, 8)).admission_budget_chunks == 8
    assert configure_request(RestoreSettings.of(TUNING, 0)).admission_budget_chunks == 0
    assert {k: got[k] for k in TIMEOUTS} == {k: getattr(s, k) for k in TIMEOUTS}


# ---- launched: argv, folders and state without starting anything -----------------------------


@pytest.fixture
def no_start(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """ServingStack.up starts nothing; the bsr.* client is a fake. The folders `up` ran in."""
    ups: list[Path] = []
    monkeypatch.setattr(launched.ServingStack, "up", lambda self: ups.append(self.dir))
    monkeypatch.setattr(launched.ServingStack, "down", lambda self: ups.append(Path("down")))
    monkeypatch.setattr(launched, "BsrModuleClient", lambda stack, timeout_s: FakeClient())
    return ups


def test_launched_deploys_each_time_fresh_sharing_the_first_fs_l2(no_start, tmp_path) -> None:
    dep = make_deployment(StackSpec(), tmp_path, RestoreSettings.of(TUNING, 0))
    assert (dep.kind, type(dep).__name__, dep.tier) == ("serving", "LaunchedDeployment", "fs")
    first = dep.stack
    assert first.dir == tmp_path / "stack"  # its folder exists before `up`
    dep.up(RestoreSettings.of(TUNING, 0))
    assert dep.stack is first and dep.ups == 1
    assert dep.client is not None and dep.client.calls == ["status", "registration"]
    dep.up(RestoreSettings.of(TUNING, 4, 8), l1_bytes=64 << 20)
    assert dep.stack.dir == tmp_path / "deploy-2" / "stack" and dep.ups == 2
    assert dep.stack.spec.lmcache.l1_size_bytes == 64 << 20
    assert (dep.stack.dir / "l2-fs").resolve() == (tmp_path / "stack" / "l2-fs").resolve()
    config = dep.stack.extensions.server_module.config
    assert (config["window_chunks"], config["admission_budget_chunks"]) == (4, 8)
    assert no_start == [tmp_path / "stack", tmp_path / "deploy-2" / "stack"]
    doc = dep.describe()
    assert (doc["kind"], doc["settings"], doc["registration_live"]) == (
        "serving",
        RestoreSettings.of(TUNING, 4, 8).to_json(),
        [],
    )
    assert doc["ports"] == {} and doc["parts"] == {}  # nothing started here
    dep.down()
    dep.down()  # teardown, then cleanup: the stack is stopped once
    assert dep.client is None and no_start[-1] == Path("down")
    assert no_start.count(Path("down")) == 1


def test_launched_with_another_server_module_keeps_the_config(no_start, tmp_path) -> None:
    module = ServerModule("tests.failmatrix.serving_mutants", {"mutations": []}, pythonpath=("x",))
    dep = make_deployment(StackSpec(), tmp_path, RestoreSettings.of(TUNING, 2), module, 30.0)
    sm = dep.stack.extensions.server_module
    assert (sm.module_path, sm.pythonpath) == ("tests.failmatrix.serving_mutants", ("x",))
    assert sm.config["mutations"] == [] and sm.config["window_chunks"] == 2
    assert dep.client_timeout_s == 30.0


def test_launched_extends_what_lmcache_loads_at_every_up(no_start, tmp_path) -> None:
    from dataclasses import replace

    from bsrctl.stack.launch.extensions import L2Device

    device = L2Device(1e8, 0.001)
    dep = launched.LaunchedDeployment(
        StackSpec(), tmp_path, extend=lambda e: replace(e, l2_device=device)
    )
    assert dep.stack.extensions.l2_device == device
    dep.up(RestoreSettings.of(TUNING, 2))  # new settings: a new stack, still extended
    assert dep.stack.extensions.l2_device == device
    assert dep.stack.extensions.server_module.config["window_chunks"] == 2


def test_launched_refuses_a_degraded_module(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(launched.ServingStack, "up", lambda self: None)
    monkeypatch.setattr(
        launched, "BsrModuleClient", lambda stack, timeout_s: FakeClient(degraded="bad W")
    )
    dep = make_deployment(StackSpec(), tmp_path)
    with pytest.raises(StackFailed, match="BSR server module degraded: bad W"):
        dep.up(RestoreSettings.of(TUNING, 2))


def test_launched_without_fs_l2_reads_mooncake(tmp_path) -> None:
    spec = StackSpec(lmcache=LmcacheSpec(fs_l2=False))
    assert make_deployment(spec, tmp_path).tier == "mooncake"


# ---- attached: configure and give back, against a fake client --------------------------------

OPERATOR = {"window_chunks": 0, "admission_budget_chunks": 0, "window_timeout_s": 9.0,
            "probe_timeout_s": 8.0, "readback": True, "other": "kept"}  # fmt: skip


@pytest.fixture
def operator(monkeypatch: pytest.MonkeyPatch) -> list[FakeClient]:
    """AttachedStack.up (the endpoint probes) passes; each client is a fake over the
    operator's module config. The clients made, in order."""
    made: list[FakeClient] = []

    def client(stack: Any, timeout_s: float) -> FakeClient:
        made.append(FakeClient(OPERATOR if not made else made[-1].config))
        return made[-1]

    monkeypatch.setattr(attached.AttachedStack, "up", lambda self, settings: None)
    monkeypatch.setattr(attached, "BsrModuleClient", client)
    return made


def attach_spec() -> StackSpec:
    return StackSpec(kind="attach", attach=ATTACH)


def test_attached_sets_w_b_timeouts_and_gives_the_operators_back(operator, tmp_path) -> None:
    dep = make_deployment(attach_spec(), tmp_path, RestoreSettings.of(TUNING, 0))
    assert (dep.kind, type(dep).__name__) == ("attach", "AttachedDeployment")
    settings = RestoreSettings.of(TUNING, 4, 8)
    dep.up(settings, l1_bytes=1 << 40)  # L1 is the operator's: not sized
    dep.up(settings)  # connects once
    (client,) = operator
    assert dep.operator_config is not None
    assert dep.operator_config.changes() == {k: v for k, v in OPERATOR.items() if k != "other"}
    assert client.calls[:3] == ["status", "registration", "status"]
    assert client.calls[3:] == [("configure", configure_request(settings).changes())] * 2
    assert dep.ups == 2
    dep.configure(8, 8, False)
    assert client.calls[-1] == (
        "configure",
        {"window_chunks": 8, "admission_budget_chunks": 8, "readback": False},
    )
    dep.down()
    assert client.calls[-2:] == [("configure", dep.operator_config.changes()), "close"]
    assert {k: client.config[k] for k in OPERATOR} == OPERATOR  # the operator's again
    assert dep.client is None


def test_attached_reconnect_sets_the_runs_settings_again(operator, tmp_path) -> None:
    dep = make_deployment(attach_spec(), tmp_path)
    settings = RestoreSettings.of(TUNING, 2)
    dep.up(settings)
    dep.reconnect()
    first, second = operator
    assert first.calls[-1] == "close"
    assert second.calls == [("configure", configure_request(settings).changes())]


def test_attached_down_after_the_deployment_went_away_stops_nothing(operator, tmp_path) -> None:
    dep = make_deployment(attach_spec(), tmp_path)
    dep.up(RestoreSettings.of(TUNING, 2))
    operator[0].refuse = True
    dep.down()  # nothing of ours to give back: no error
    assert operator[0].calls[-1] == "close" and dep.client is None


def test_attached_ensure_up_and_audit_read_the_operators_health(monkeypatch, tmp_path) -> None:
    dep = make_deployment(attach_spec(), tmp_path)
    health = {"vllm": {"healthy": True}, "lmcache": {"healthy": False}}
    monkeypatch.setattr(dep.stack, "health", lambda: health)
    with pytest.raises(StackFailed, match=r"attach: \['lmcache'\] not healthy before the cell"):
        dep.ensure_up(lambda _m: None)
    assert dep.audit([123]) == ([], {"vllm": True, "lmcache": False})
    assert dep.vllm_log() is None and dep.tier == "fs"  # the spec's before connecting


# ---- the selector ---------------------------------------------------------------------------


def test_make_deployment_refuses_what_runs_no_serving_deployment(tmp_path) -> None:
    with pytest.raises(BadInput, match="stack.kind: 'storage' runs no serving deployment"):
        make_deployment(StackSpec(kind="storage"), tmp_path)
    with pytest.raises(BadInput, match="a substitute module or extension needs a launched"):
        make_deployment(attach_spec(), tmp_path, server_module=ServerModule("m"))
    with pytest.raises(BadInput, match="a substitute module or extension needs a launched"):
        make_deployment(attach_spec(), tmp_path, extend=lambda e: e)


def test_make_target_by_stack_kind(tmp_path) -> None:
    from bsrctl.stack.measure.target import RunningTarget
    from bsrctl.stack.storage.target import StorageTarget

    storage = make_target(TargetSpec(stack=StackSpec(kind="storage")), tmp_path)
    assert type(storage) is StorageTarget and storage.kind == "storage"
    serving = make_target(TargetSpec(), tmp_path)
    assert type(serving) is RunningTarget and serving.kind == "serving"
    on_attach = make_target(TargetSpec(stack=attach_spec()), tmp_path)
    assert type(on_attach) is RunningTarget and on_attach.kind == "attach"
    assert type(on_attach.deployment).__name__ == "AttachedDeployment"
    assert on_attach.describe() == {"kind": "attach", "registration": on_attach.reg.to_dict()}
