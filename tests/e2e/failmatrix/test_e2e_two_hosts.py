"""Two hosts on one machine, on the real stack: the serving node (vLLM + LMCache) and the
storage node (Mooncake master + store) are two network namespaces this run creates, joined by
one veth pair (198.18.0.0/30). ONE deployment for the module: the routes it created, the
Mooncake failure cells across it, and `storage-node-partitioned` (link down mid-restore)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bsrctl.evidence.verdict import Verdict
from bsrctl.experiments.failmatrix import ServingRig, load_matrix
from bsrctl.stack.launch.process import pids_alive
from bsrctl.stack.launch.twohost import SERVING_ADDR, STORAGE_ADDR

pytestmark = [pytest.mark.e2e, pytest.mark.mooncake]
MATRIX = Path(__file__).parents[3] / "matrices" / "cpu-two-hosts.yaml"


def host_ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory):
    try:
        import mooncake  # noqa: F401
    except Exception as exc:
        pytest.skip(f"mooncake unavailable ({exc!r})")
    from bsrctl.stack.launch.netns import namespace_support

    if not namespace_support().ok:
        pytest.skip(namespace_support().detail)
    spec, _ = load_matrix(MATRIX)
    r = ServingRig(spec, tmp_path_factory.mktemp("two-hosts"), lambda _: None)
    hosts_if: list[str] = []
    try:
        r.prepare(spec.cells)
        assert r.stack.hosts is not None
        hosts_if += [r.stack.hosts.serving_if, r.stack.hosts.storage_if]
        yield r
    finally:
        holders = [h.pid for h in r.stack.launched if h.name.startswith("netns")]
        r.close()
        pids = [p for part in r.stack.launched for p in [part.pid, *part._children] if p]
        assert pids_alive(pids) == [], f"left running: {pids_alive(pids)}"
        # both namespaces gone (and the storage node storage-node-lost destroyed and rebuilt)
        assert len(holders) in (2, 3) and pids_alive(holders) == []
        links = host_ip("-o", "link", "show")
        assert not any(name in links for name in hosts_if), "veth pair left behind"


def cell(rig: ServingRig, cid: str):
    return next(c for c in rig.spec.cells if c.id == cid)


def test_only_the_routes_it_created(rig: ServingRig) -> None:
    h = rig.stack.hosts
    r = h.routes()
    assert r["serving.routes"] == [
        f"198.18.0.0/30 dev {h.serving_if} proto kernel scope link src {SERVING_ADDR} "
    ]
    assert r["storage.routes"] == [
        f"198.18.0.0/30 dev {h.storage_if} proto kernel scope link src {STORAGE_ADDR} "
    ]
    assert r["serving.addrs"] == ["lo inet 127.0.0.1/8", f"{h.serving_if} inet {SERVING_ADDR}/30"]
    assert r["storage.addrs"] == ["lo inet 127.0.0.1/8", f"{h.storage_if} inet {STORAGE_ADDR}/30"]
    # the machine's own namespace: no address, route or link of the run
    assert "198.18." not in host_ip("-o", "addr", "show")
    assert "198.18." not in host_ip("-o", "route", "show", "table", "all")
    assert h.serving_if not in host_ip("-o", "link", "show")
    # the Mooncake store listens on the storage node, LMCache reaches it across the veth
    moon = rig.stack.mooncake
    assert moon.endpoints.master_address.startswith(f"{STORAGE_ADDR}:")
    argv = " ".join(rig.stack.parts["lmcache"].argv)
    assert f'"master_server_address": "{STORAGE_ADDR}:' in argv
    assert f'"local_hostname": "{SERVING_ADDR}"' in argv


@pytest.mark.parametrize("cid", ["mooncake-down-before-request", "mooncake-killed-mid-restore"])
def test_mooncake_cells_pass_across_the_two_hosts(rig: ServingRig, cid: str) -> None:
    point = rig.run_cell(cell(rig, cid))
    assert point.verdict == Verdict.PASS, [c for c in point.checks if c.verdict != "PASS"]
    want = 3840 if cid == "mooncake-down-before-request" else 0
    assert point.measures["cached_tokens"] == want


def test_storage_node_partitioned_fails_closed_and_recovers(rig: ServingRig) -> None:
    c = cell(rig, "storage-node-partitioned")
    point = rig.run_cell(c)
    assert point.verdict == Verdict.PASS, [x for x in point.checks if x.verdict != "PASS"]
    m = point.measures
    assert m["cached_tokens"] == 0  # the whole restore failed closed: recomputed
    assert m["output_sha256"] == m["canonical_sha256"]
    assert m["time_to_fallback_s"] is not None and m["time_to_fallback_s"] < c.bound_s
    notes = point.extra["fault_notes"]
    assert notes["link_down"]["interface"] == rig.stack.hosts.serving_if
    assert notes["link_up"]["healthy"] is True
    health = next(x for x in point.checks if x.name == "post_request_health")
    assert health.verdict == Verdict.PASS, health.detail  # a canonical follow-up after link up


def test_storage_node_lost_every_later_request_is_canonical(rig: ServingRig) -> None:
    old = rig.stack.hosts.storage.pid
    point = rig.run_cell(cell(rig, "storage-node-lost"))
    by = {c.name: c for c in point.checks}
    assert point.verdict == Verdict.PASS, {n: (c.verdict, c.detail) for n, c in by.items()}
    assert point.measures["cached_tokens"] == 0  # failed closed: recomputed
    assert by["later_requests_canonical"].detail.count("canonical in") == 3
    notes = point.extra["fault_notes"]
    assert notes["lost"]["storage_netns_holder"] == old and not pids_alive([old])
    assert notes["rebuilt"]["storage_netns_holder"] != old  # a new storage node after
    assert pids_alive(notes["lost"]["mooncake"]) == []
