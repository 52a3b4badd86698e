"""`bsrctl roundtrip` across two hosts on one machine: Mooncake on the storage node
(198.18.0.2), vLLM + LMCache on the serving node (198.18.0.1), one veth pair between the two
namespaces the run creates. The same exact counts as the one-host demo; nothing of the
topology outlives the run, and the machine's own namespace never gets an address of it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bsrctl.evidence import load_evidence
from bsrctl.stack.launch.process import pids_alive

pytestmark = [pytest.mark.e2e, pytest.mark.mooncake]
DEMO = Path(__file__).parents[2] / "ladders" / "demo-roundtrip.yaml"


def host_ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_roundtrip_across_two_hosts(tmp_path: Path, bsrctl: Callable[..., Any]) -> None:
    from bsrctl.stack.launch.netns import namespace_support

    if not namespace_support().ok:
        pytest.skip(namespace_support().detail)
    spec = tmp_path / "two-hosts.yaml"
    spec.write_text(DEMO.read_text().replace(
        "    enabled: true", "    enabled: true\n    topology: two-hosts", 1
    ))  # fmt: skip
    links_before = host_ip("-o", "link", "show")
    res = bsrctl("roundtrip", str(spec), "--out", str(tmp_path / "out"), "--quiet", timeout=600)
    (run_dir,) = (tmp_path / "out").iterdir()
    doc = load_evidence(run_dir / "evidence.json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (doc["complete"], doc["verdict"]) == (True, "PASS")
    tiers = ["cold", "l1", "fs", "mooncake"]
    m = {p["id"]: p["measures"] for p in doc["points"]}
    assert [m[t]["external_hit_tokens"] for t in tiers] == [0, 4095, 4095, 4095]
    assert m["mooncake"]["l2_keys_served"] == {"fs": 0, "mooncake": 16}
    assert len({m[t]["output_sha256"] for t in m} | {m[t]["canonical_sha256"] for t in m}) == 1
    topo = doc["stack"]["topology"]
    assert (topo["serving_node"]["address"], topo["storage_node"]["address"]) == (
        "198.18.0.1", "198.18.0.2",
    )  # fmt: skip
    assert doc["stack"]["mooncake"]["endpoints"]["master_address"].startswith("198.18.0.2:")
    lm = doc["stack"]["parts"]["lmcache"]["argv"]
    assert any('"local_hostname": "198.18.0.1"' in a for a in lm)
    # nothing of the topology is left, and none of it was ever in the machine's namespace
    holders = [topo["serving_node"]["netns_pid"], topo["storage_node"]["netns_pid"]]
    state = json.loads((run_dir / "stack" / "state.json").read_text())
    launched = [p for part in state["launched"] for p in [part["pid"], *part["children"]] if p]
    assert pids_alive([*holders, *launched]) == []
    links = host_ip("-o", "link", "show")
    assert topo["serving_node"]["interface"] not in links and links == links_before
    assert "198.18." not in host_ip("-o", "addr", "show")
