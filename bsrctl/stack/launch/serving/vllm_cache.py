"""vLLM's cache folder for one run, with the model-class inspection shared between runs.

Each vLLM gets its own ``VLLM_CACHE_ROOT`` (under the run), but on a miss of
``<root>/modelinfos/`` vLLM inspects the model class in a fresh interpreter (vllm 0.32
``model_executor/models/registry.py:1044-1090``, ``_run_in_subprocess`` at :1550), which
imports torch and vLLM again: 10-30 s of both cores per start on this machine, the same
answer every time. So ``modelinfos/`` is one folder for every run, beside the model and
canonical caches. What vLLM keeps there is keyed by the model module's file hash and read
back only when it matches (:994-1024), written by rename (``atomic_writer``, :1026-1041): a
stale entry is inspected again, and two runs at once never read half a file.
"""

from __future__ import annotations

from pathlib import Path

from bsrctl.stack.launch import tinymodel


def shared_modelinfos() -> Path:
    return tinymodel.default_cache_dir().parent / "vllm-modelinfos"


def vllm_cache_root(run_cache: Path) -> Path:
    """``run_cache`` (created) with ``modelinfos`` linked to ``shared_modelinfos()``."""
    shared = shared_modelinfos()
    shared.mkdir(parents=True, exist_ok=True)
    run_cache.mkdir(parents=True, exist_ok=True)
    link = run_cache / "modelinfos"
    if not link.is_symlink() and not link.exists():
        link.symlink_to(shared.resolve(), target_is_directory=True)
    return run_cache
