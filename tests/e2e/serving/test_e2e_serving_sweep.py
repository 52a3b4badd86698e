"""`sweep` on the real CPU stack (vLLM + LMCache MP server with the BSR module), cpu-smoke:
one deployment (the package's kept one, shared with law), W = 2 then W = 0 per size, the
largest size again with a new salt."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsrctl.evidence import Verdict

from .e2e_support import SMOKE, C, assert_still_running, only_run, require_server_module

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, smoke_stack):
    """On the package's kept cpu-smoke deployment (law's run launched it when it ran first)."""
    require_server_module()
    from bsrctl.experiments.restore.sweep import run_sweep

    out = tmp_path_factory.mktemp("sweep")
    verdict = run_sweep(
        SMOKE, out, "serving", quiet=True, repeat_new_salt=True, deployment=smoke_stack
    )
    return verdict, out, only_run(out)


def test_every_point_passes_with_exact_counts(sweep) -> None:
    verdict, _, doc = sweep
    assert (verdict, doc["complete"]) == (Verdict.PASS, True), doc["summary"]
    ids = [p["id"] for p in doc["points"]]
    assert ids == ["n1024-w2", "n1024-w0", "n2048-w2", "n2048-w0", "n2048-w2-new-salt"]
    for p in doc["points"]:
        m = p["measures"]
        n = m["tokens"]
        assert p["verdict"] == "PASS", p["checks"]
        (g,) = [c for c in p["checks"] if c["name"] == "extensions_healthy"]  # read, none
        assert g["detail"] == "no guard failure in LMCache server"
        assert m["cached_tokens"] == m["external_hit_tokens"] == n - 1  # vLLM computes the last
        assert m["output_sha256"] == m["canonical_sha256"]
        assert m["l1_bytes_before_restore"] == 0
        # the cold request's prefix reached FS L2 before L1 was emptied (first try)
        assert (m["seed_chunks_expected"], m["seed_chunks_held"]) == (n // 256, n // 256)
        assert [a["held_chunks"] for a in m["seed"]["attempts"]] == [n // 256]


def test_restore_pool_flat_for_w2_and_growing_for_w0(sweep) -> None:
    _, _, doc = sweep
    peaks = {p["id"]: p["measures"]["restore_pool_peak_bytes"] for p in doc["points"]}
    assert peaks == {
        "n1024-w2": 2 * C,
        "n1024-w0": 4 * C,
        "n2048-w2": 2 * C,
        "n2048-w0": 8 * C,
        "n2048-w2-new-salt": 2 * C,
    }
    s = doc["summary"]
    assert s["peak_identical_across_sizes"] and s["whole_plan_peak_grows"]
    # cpu-smoke keeps one timed pass per point (repeats: 1) after its accuracy pass: one
    # production-path sample, no interval, and BSR's TTFT against the whole plan is reported
    # from one pair, not judged; the new-salt rerun is one pass with the oracle, unsampled
    for p in doc["points"]:
        if p["id"].endswith("new-salt"):
            assert "samples" not in p and "sample_path" not in p
            continue
        assert (p["repeats"], p["sample_path"]) == (1, "production")
        assert set(p["samples"]) == {"ttft_s", "restore_s", "retrieve_s"}
        assert p["intervals"] == {} and set(p["accuracy_pass"]) == set(p["samples"])
        m = p["measures"]
        assert m["ttft_s"] == p["samples"]["ttft_s"][0]
        # restore_s runs from the lookup of the prefix: at least the retrieve after it
        assert m["restore_s"] >= m["retrieve_s"] > 0
    for n, r in s["whole_plan_ratio_by_tokens"].items():
        pts = {p["id"]: p["measures"] for p in doc["points"]}
        ratio = pts[f"n{n}-w2"]["ttft_s"] / pts[f"n{n}-w0"]["ttft_s"]
        assert (r["metric"], r["repeats"], r["interval"], r["judged"]) == ("ttft_s", 1, None, False)
        assert r["ratio"] == ratio and r["verdict"] == "UNKNOWN"  # median of one a/b
        assert "cannot test significance" in r["detail"]


def test_one_deployment_and_nothing_left_behind(sweep, smoke_stack) -> None:
    """One launch for the run (and for law's before it); the run's end stops nothing of the
    kept deployment, whose teardown checks every process gone (conftest.py)."""
    _, out, doc = sweep
    assert doc["run_id"].startswith("br-e1-")
    (run,) = [p for p in Path(out).iterdir() if p.is_dir()]
    assert list(run.glob("deploy-*")) == []  # one deployment: no engine relaunch
    assert (smoke_stack.stack.dir / "state.json").is_file()
    assert smoke_stack.launches == 1
    assert doc["stack"]["parts"]["vllm"]["pid"] == smoke_stack.stack.parts["vllm"].pid
    assert_still_running(smoke_stack)


def test_derived_registration_is_the_live_one(sweep) -> None:
    """cpu-smoke says `registration: auto`: the tiny Llama's config.json derives c, and it is
    what vLLM registered with LMCache (REGISTER_KV_CACHE, read back by bsr.registration)."""
    _, _, doc = sweep
    assert doc["stack"]["registration"]["bytes_per_chunk"] == C
    (live,) = doc["stack"]["registration_live"]
    assert [(t["shape"], t["dtype"], t["group"]) for t in live["tensors"]] == [
        ([2, 256, 2, 32], "float32", 0)
    ] * 2
    for p in doc["points"]:
        checks = {c["name"]: c for c in p["checks"]}
        assert "2 tensors derived == live == stored" in checks["registration_identity"]["detail"]


def test_every_point_reports_the_install_read_back_and_the_output_divergence(sweep) -> None:
    """Read-back is on by default: in every point's accuracy pass each BSR window installed
    was read back from vLLM's KV through LMCache's store copy and equals the staged bytes;
    the whole-plan (W = 0) points say they were not read back (LMCache's own retrieve
    installs them). The restored output is bit-exact against the reference in every pass,
    logprob for logprob as far as the gap shows."""
    _, _, doc = sweep
    for p in doc["points"]:
        m, rb = p["measures"], p["measures"]["readback"]
        checks = {c["name"]: c for c in p["checks"]}
        assert rb["enabled"] is True and rb["mismatches"] == 0 and not rb["scratch_in_aux"]
        assert m["output_first_divergence"] is None and m["output_tolerance"] is None
        assert isinstance(m["output_max_logprob_gap"], float)
        assert "bit-exact tokens" in checks["canonical_output"]["detail"]
        if m["window_chunks"] == 0:
            assert (rb["path"], rb["windows_checked"]) == (
                "stock whole-plan retrieve: not read back",
                0,
            )
            assert "install_readback" not in checks
            continue
        n = m["tokens"] // 256
        assert rb["path"] == "bsr windows"
        assert rb["windows_checked"] == m["windows_done"] == n // 2  # W = 2, one rank
        assert (rb["chunks_checked"], rb["chunks_unchecked"]) == (n, 0)
        assert rb["scratch_bytes"] == C  # one chunk of the one object group
        assert rb["seconds"] > 0 and rb["install_seconds"] > 0
        assert checks["install_readback"]["verdict"] == "PASS"


def test_run_folder_has_a_timeline_with_every_process_spans(sweep) -> None:
    import json

    from bsrctl.trace.command import timeline_text

    _, out, doc = sweep
    run = next(p.parent for p in Path(out).glob("*/evidence.json"))
    events = json.loads((run / "timeline.json").read_text())["traceEvents"]
    services = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"bsrctl", "bsrkv.server", "vllm", "lmcache"} <= services, services
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"client.request", "llm_request", "bsr.probe", "bsr.fetch", "bsr.install"} <= names
    print(timeline_text(run, top=1))
