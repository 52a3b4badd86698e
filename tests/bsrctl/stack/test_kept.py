"""The kept deployment (the suite's shared cpu-smoke stack): the first run launches, later
runs set W, B and timeouts over bsr.configure, a run's end stops nothing, ``close`` stops it;
an L1 or a launch-only setting it was not launched with is refused. A fake stands for the
launched deployment (no process starts)."""

from __future__ import annotations

import pytest

from bsrctl.errors import BadInput
from bsrctl.specs import StackSpec
from bsrctl.stack.contracts.deployment import configure_request
from bsrkv.lmcache_ext.bsr.protocol import ConfigureRequest
from bsrkv.settings import RestoreSettings
from tests.bsrctl.stack.kept import KeptDeployment

L1 = 8 << 20


class FakeClient:
    def __init__(self) -> None:
        self.configured: list[ConfigureRequest] = []

    def configure(self, request: ConfigureRequest) -> None:
        self.configured.append(request)


class FakeLaunched:
    """What KeptDeployment reads of a LaunchedDeployment, with a log of what it was asked."""

    def __init__(self) -> None:
        self.spec = StackSpec.model_validate({"kind": "serving", "lmcache": {"l1_size_bytes": L1}})
        self.settings = RestoreSettings()
        self.running = False
        self.client: FakeClient | None = None
        self.calls: list[str] = []

    def check(self) -> None:
        self.calls.append("check")

    def up(self, settings: RestoreSettings, l1_bytes: int | None = None) -> None:
        self.calls.append(f"up {l1_bytes}")
        self.settings, self.running, self.client = settings, True, FakeClient()

    def down(self) -> None:
        self.calls.append("down")
        self.running = False


def kept() -> tuple[KeptDeployment, FakeLaunched]:
    fake = FakeLaunched()
    return KeptDeployment(fake), fake  # type: ignore[arg-type]


def test_first_up_launches_later_ups_configure_and_a_run_end_stops_nothing() -> None:
    dep, fake = kept()
    first, second = RestoreSettings(window_chunks=2), RestoreSettings(window_chunks=8)
    dep.check()
    dep.up(first, L1)
    assert (fake.calls, dep.launches, dep.ups) == (["check", "up 8388608"], 1, 1)
    dep.down()
    assert (fake.calls[-1], dep.ups, fake.running) == ("up 8388608", 0, True)
    dep.check()  # its ports are its own now: not checked again
    dep.up(second)  # None: the spec's L1, the one it was launched with
    assert fake.client is not None
    assert fake.client.configured == [configure_request(second)]
    assert configure_request(second).window_chunks == 8
    assert (dep.settings, dep.launches, dep.ups) == (second, 1, 1)
    assert fake.calls == ["check", "up 8388608"]
    dep.close()
    assert (fake.calls[-1], fake.running, dep.ups) == ("down", False, 0)


def test_another_l1_or_launch_only_setting_is_refused() -> None:
    dep, _ = kept()
    dep.up(RestoreSettings(window_chunks=2), L1)
    with pytest.raises(BadInput, match=f"has L1 {L1} B; this run asks {2 * L1} B"):
        dep.up(RestoreSettings(window_chunks=2), 2 * L1)
    # fixed at launch: no field of the request
    assert "load_concurrency" not in ConfigureRequest.__struct_fields__
    more = RestoreSettings().load_concurrency + 1
    with pytest.raises(BadInput, match="only W, B and the timeouts are set at run time"):
        dep.up(RestoreSettings(window_chunks=2, load_concurrency=more), L1)
    assert dep.ups == 1
