"""`bsrctl doctor`: what this machine has for the stack, and what to do about each gap."""

from __future__ import annotations

import ctypes.util
import shutil
from pathlib import Path

import psutil

from bsrctl.specs import StackSpec
from bsrctl.stack.doctor.checks import (
    PINS,
    Finding,
    dist_findings,
    gb,
    gpu_findings,
    profile,
    spec_findings,
    torch_finding,
    weights_finding,
)
from bsrctl.stack.doctor.facts import MachineFacts, gather, installed_dists
from bsrctl.stack.doctor.surface import surface_findings
from bsrctl.stack.launch import shm_ledger
from bsrctl.stack.launch.netns import namespace_support

__all__ = ["PINS", "Finding", "MachineFacts", "diagnose", "dist_findings", "gpu_findings"]
MIN_FREE_DISK_BYTES = 10 << 30
MIN_AVAILABLE_MEM_BYTES = 8 << 30


def found_dists() -> dict[str, tuple[str, str] | None]:
    """Per pinned import package, the (distribution, version) installed here, or None."""
    got = {p: (d, v) for p, d, v in installed_dists()}
    return {p: got.get(p) for p in PINS}


def weights_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def model_findings(folder: Path, facts: MachineFacts | None = None) -> list[Finding]:
    """A local model folder: config.json, an architecture `registration: auto` knows (and
    its c at TP 1, 256-token chunks), weights, and on a GPU whether they fit one GPU at TP 1
    in vLLM's default 90 % (``doctor --spec`` checks the spec's TP shards instead)."""
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
    weights = weights_bytes(folder)
    ok = weights > 0
    value = f"{gb(weights)} of safetensors" if ok else "no *.safetensors"
    rows.append(Finding(f"{name} weights", ok, value, "copy the model's *.safetensors in"))
    if ok and facts is not None and facts.gpus:
        biggest = max(facts.gpus, key=lambda g: g.total_bytes)
        fit = weights_finding([biggest], weights, 1, 0.9)
        rows.append(Finding(f"{name} fits the GPU", fit.ok, fit.value, fit.fix))
    return rows


def diagnose(
    work_dir: Path = Path("."),
    model: Path | None = None,
    facts: MachineFacts | None = None,
    stack: StackSpec | None = None,
    where: str = "the spec",
) -> list[Finding]:
    """Every row, for this machine (or injected ``facts``) and, given one, a spec's stack
    section: the wheels, the host, the device profile, the GPUs, the model folder and what
    the spec's deployment needs. The host rows are read here; the rest is over ``facts``."""
    facts = facts if facts is not None else gather()
    head, tail = fact_findings(facts, stack, model, where)
    return head + host_findings(work_dir) + tail


def fact_findings(
    facts: MachineFacts,
    stack: StackSpec | None = None,
    model: Path | None = None,
    where: str = "the spec",
) -> tuple[list[Finding], list[Finding]]:
    """The rows over ``facts`` (and a model folder): the wheels, then the device, the GPUs,
    the model and the spec's deployment (doctor prints the host rows in between)."""
    # a spec that sets no stack.device is checked as the machine is (and told to set it)
    chosen = stack.device if stack is not None and "device" in stack.model_fields_set else None
    device = profile(facts, chosen)
    mooncake = stack is not None and stack.mooncake.enabled
    head = dist_findings({p: facts.dist(p) for p in PINS}, device, need_mooncake=mooncake)
    head.append(torch_finding((facts.dist("torch") or ("", None))[1], device))
    for extra in ("torchvision", "torchaudio", "triton") if device == "cpu" else ():
        if got := facts.dist(extra):
            head.append(Finding(extra, False, got[1], f"pip uninstall -y {extra} (breaks CPU)"))
    head += surface_findings(facts.surface)
    tail = [device_finding(facts, device, stack, where)]
    tail += gpu_findings(facts, device, need_mooncake=mooncake)
    if stack is not None and model is None and stack.vllm.model != "tiny":
        model = Path(stack.vllm.model)
    weights = 0
    if model is not None:
        tail += model_findings(Path(model), facts if stack is None else None)
        weights = weights_bytes(Path(model))
    if stack is not None:
        tail += spec_findings(facts, stack, weights, where, device)
    return head, tail


def device_finding(
    facts: MachineFacts, device: str, stack: StackSpec | None, where: str
) -> Finding:
    """Which profile this machine is held to, and why."""
    seen = f"{len(facts.gpus)} GPU(s)" if facts.gpus else "no GPU"
    if stack is None:
        return Finding("device", True, f"{device} (this machine: {seen})", required=False)
    if device == stack.device:
        value = f"{device} (stack.device of {where}; this machine: {seen})"
        return Finding("device", True, value, required=False)
    value = f"{device} (this machine: {seen}); {where} deploys stack.device {stack.device}"
    return Finding("device", False, value, f"set stack.device: {device} in {where}", False)


def host_findings(work_dir: Path) -> list[Finding]:
    """Namespaces, libibverbs, disk, dead runs' /dev/shm, memory: the same on every profile."""
    rows = []
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
