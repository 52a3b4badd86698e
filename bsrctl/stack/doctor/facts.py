"""What `bsrctl doctor` reads of this machine, gathered in one place (``gather``).

Everything here is I/O, bounded in time; the checks over these facts are pure
(``doctor_checks``) and tests inject facts of machines they do not have (an H200 node).
torch, vLLM and LMCache are never imported in this process: torch's CUDA view and the
``lmcache.cuda_ops`` import run in a bounded subprocess, and only on a GPU node.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bsrctl.stack.doctor.uses import DECLARED
from bsrctl.stack.launch.versions import provider
from bsrkv.hostsurface.check import CONNECTOR_DECLARED, Report, check

NVIDIA_SMI_TIMEOUT_S = 10.0
TORCH_PROBE_TIMEOUT_S = 180.0  # importing torch + lmcache and a CUDA init on 8 GPUs
INFINIBAND = Path("/sys/class/infiniband")
PACKAGES = ("vllm", "lmcache", "mooncake", "torch", "torchvision", "torchaudio", "triton")
_CUDART = re.compile(rb"libcudart\.so\.(\d+)")
_MARK = "BSRCTL_PROBE "


class Gpu(NamedTuple):
    name: str
    total_bytes: int


@dataclass(frozen=True)
class TorchFacts:
    """torch's view of CUDA, from a subprocess (``torch_facts``)."""

    version: str | None  # None: torch does not import (``error`` says why)
    cuda: str | None = None  # torch.version.cuda; None: a CPU build
    devices: tuple[Gpu, ...] = ()  # what torch.cuda sees (CUDA_VISIBLE_DEVICES applies)
    cuda_ops: str = "not tried"  # "ok", or how `import lmcache.cuda_ops` failed
    error: str = ""


@dataclass(frozen=True)
class MachineFacts:
    """Everything doctor's checks read of a machine. Defaults: a bare machine."""

    gpus: tuple[Gpu, ...] = ()  # nvidia-smi's, physical indices (stack.vllm.gpus names these)
    gpu_probe: str = ""  # how the GPUs were found, or why none were
    dists: tuple[tuple[str, str, str], ...] = ()  # (import package, distribution, version)
    driver_cuda: tuple[int, int] | None = None  # the newest CUDA the driver runs (major, minor)
    driver_probe: str = ""  # why driver_cuda is None
    torch: TorchFacts | None = None  # None: not probed (a CPU node)
    lmcache_cuda: int | None = None  # libcudart major lmcache.cuda_ops links; None: unknown
    mooncake_cuda: int | None = None  # the Mooncake wheel's libcudart major; 0: a CPU build
    rdma: tuple[str, ...] | None = None  # /sys/class/infiniband entries; None: no such folder
    surface: tuple[Report, ...] = ()  # the declared vLLM/LMCache names checked; (): not read

    def dist(self, package: str) -> tuple[str, str] | None:
        """(distribution, version) providing import package ``package``; None if none."""
        return next(((d, v) for p, d, v in self.dists if p == package), None)


def nvidia_smi() -> tuple[tuple[Gpu, ...], str]:
    """nvidia-smi's GPUs and how they were found, bounded in time. No nvidia-smi, or one
    that fails: no GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return (), "no nvidia-smi on PATH"
    try:
        res = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"nvidia-smi failed: {exc}"
    if res.returncode != 0:
        return (), f"nvidia-smi exit {res.returncode}: {res.stderr.strip()}"
    gpus = []
    for line in res.stdout.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            gpus.append(Gpu(name.strip(), int(mib.strip()) << 20))
    return tuple(gpus), "nvidia-smi"


def driver_cuda() -> tuple[tuple[int, int] | None, str]:
    """The CUDA version the installed driver supports (cuDriverGetVersion of libcuda.so.1:
    no cuInit, no torch), or None and why."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, f"no NVIDIA driver library ({exc})"
    got = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(got))
    if rc != 0:
        return None, f"cuDriverGetVersion failed ({rc})"
    return (got.value // 1000, got.value % 1000 // 10), "cuDriverGetVersion"


def cudart_major(binary: Path) -> int:
    """The libcudart major a shared object links (its dynamic string table names
    libcudart.so.N); 0 when it links none."""
    found = _CUDART.search(binary.read_bytes())
    return int(found.group(1)) if found else 0


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # a top-level package: nothing is executed
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def lmcache_cuda() -> int | None:
    """The CUDA major lmcache's wheel is built for: what its ``cuda_ops`` extension links
    (lmcache 0.5.6: libcudart.so.13; its METADATA also requires cupy-cuda13x and
    cuda-python>=13,<14). None without lmcache or the extension."""
    where = _package_dir("lmcache")
    found = sorted(where.glob("cuda_ops*.so")) if where else []
    return cudart_major(found[0]) if found else None


def mooncake_cuda() -> int | None:
    """The CUDA major of the installed Mooncake wheel (its engine.so); 0: the non-CUDA build;
    None: no Mooncake. mooncake-transfer-engine 0.3.13.post1 links libcudart.so.12,
    mooncake-transfer-engine-cuda13 libcudart.so.13 (read from both wheels)."""
    where = _package_dir("mooncake")
    engine = where / "engine.so" if where else None
    return cudart_major(engine) if engine and engine.is_file() else None


def rdma_devices(root: Path = INFINIBAND) -> tuple[str, ...] | None:
    """The RDMA devices the kernel exposes (mlx5_0, ...); None when it exposes none at all."""
    if not root.is_dir():
        return None
    return tuple(sorted(p.name for p in root.iterdir()))


# Run by `python -c`: prints one marked JSON line whatever LMCache logs on the way.
_PROBE = f"""
import json
out = {{"version": None}}
try:
    import torch
    out.update(version=torch.__version__, cuda=torch.version.cuda, devices=[])
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["devices"].append([p.name, p.total_memory])
    try:
        import lmcache.cuda_ops
        out["cuda_ops"] = "ok"
    except Exception as exc:
        out["cuda_ops"] = f"{{type(exc).__name__}}: {{exc}}"
except Exception as exc:
    out["error"] = f"{{type(exc).__name__}}: {{exc}}"
print({_MARK!r} + json.dumps(out), flush=True)
"""


def torch_facts(timeout_s: float = TORCH_PROBE_TIMEOUT_S) -> TorchFacts:
    """torch's CUDA view and the ``lmcache.cuda_ops`` import, in a subprocess of this
    interpreter bounded by ``timeout_s`` (a wedged driver hangs CUDA init)."""
    try:
        res = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return TorchFacts(None, error=f"the torch probe failed: {exc}")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(_MARK)]
    if not lines:
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return TorchFacts(None, error=f"the torch probe exit {res.returncode}: {tail}")
    got = json.loads(lines[-1].removeprefix(_MARK))
    return TorchFacts(
        got["version"],
        got.get("cuda"),
        tuple(Gpu(n, int(b)) for n, b in got.get("devices", [])),
        got.get("cuda_ops", "not tried"),
        got.get("error", ""),
    )


def installed_dists() -> tuple[tuple[str, str, str], ...]:
    """(import package, distribution, version) for each package doctor pins."""
    return tuple((p, *found) for p in PACKAGES if (found := provider(p)) is not None)


def gather(probe_torch: bool | None = None) -> MachineFacts:
    """This machine's facts. torch is probed when ``probe_torch``, or (None) when this is
    a GPU node: nvidia-smi lists GPUs or the CUDA vLLM is installed."""
    gpus, probe = nvidia_smi()
    dists = installed_dists()
    cuda, why = driver_cuda()
    if probe_torch is None:
        probe_torch = bool(gpus) or any(d == "vllm" for _, d, _ in dists)
    return MachineFacts(
        gpus=gpus,
        gpu_probe=probe,
        dists=dists,
        driver_cuda=cuda,
        driver_probe=why,
        torch=torch_facts() if probe_torch else None,
        lmcache_cuda=lmcache_cuda(),
        mooncake_cuda=mooncake_cuda(),
        rdma=rdma_devices(),
        surface=surface(),
    )


def surface(roots: dict[str, Path] | None = None) -> tuple[Report, ...]:
    """vLLM's and LMCache's declared names (LMCache's connector's reads of vLLM included)
    against each tree: ``roots[package]`` (a side folder), else this interpreter's. Their
    source is read, nothing of them imported."""
    roots = roots or {}
    declared = DECLARED + CONNECTOR_DECLARED
    return tuple(check(p, roots.get(p), declared) for p in ("vllm", "lmcache"))
