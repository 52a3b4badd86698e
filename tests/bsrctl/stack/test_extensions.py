"""bsrctl's LMCache extensions as the stacks load them: built from RestoreSettings, the module
path a parameter (the failure matrix's mutants), nothing else naming bsrkv.lmcache_ext."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bsrctl.stack.launch import extensions
from bsrctl.stack.launch.extensions import bsr_extensions
from bsrkv.settings import RestoreSettings

BSR = Path(extensions.__file__).parents[1]


def test_bsr_server_module_from_the_restore_settings() -> None:
    s = RestoreSettings(window_chunks=4, load_concurrency=3, checksum=False)
    ext = bsr_extensions(s)
    assert ext.server_module.to_json() == {
        "module_path": "bsrkv.lmcache_ext.server",
        "factory_name": "build_server_modules",
        "config": {  # RestoreSettings whole: the server module's config is built from it
            "window_timeout_s": 30.0,
            "probe_timeout_s": 10.0,
            "admission_timeout_s": 120.0,
            "retrieve_deadline_s": 45.0,
            "drain_timeout_s": 5.0,
            "stall_guard_s": 5.0,
            "load_concurrency": 3,
            "checksum": False,
            "checksum_algorithm": "xxh3_128",
            "use_odirect": False,
            "window_staging": "direct",
            "readback": True,
            "window_chunks": 4,
            "admission_budget_chunks": 4,  # B = W when unset
        },
    }
    assert (ext.load_concurrency, ext.checksum, ext.retrieve_deadline_s) == (3, False, 45.0)


def test_another_module_is_a_parameter() -> None:
    s = RestoreSettings(window_chunks=2, admission_budget_chunks=6)
    real = bsr_extensions(s).server_module.to_json()
    mutant = bsr_extensions(
        s, module_path="bsrkv.lmcache_ext.failmatrix_mutants", extra_config={"mutations": ["x"]}
    ).server_module.to_json()
    assert mutant["module_path"] == "bsrkv.lmcache_ext.failmatrix_mutants"
    assert mutant["config"] == {**real["config"], "mutations": ["x"]}
    assert real["config"]["admission_budget_chunks"] == 6


def test_the_json_is_a_fresh_copy_each_time() -> None:
    ext = bsr_extensions(RestoreSettings())
    first = ext.server_module.to_json()
    first["config"]["mutations"] = ["y"]
    assert "mutations" not in ext.server_module.to_json()["config"]


def test_every_module_path_the_stacks_hand_to_lmcache_exists() -> None:
    # LMCache imports these by name in its own process: a stale path fails only at launch.
    paths = [
        extensions.BSR_SERVER_MODULE,
        extensions.FAULT_ADAPTER_MODULE,
        extensions.MOONCAKE_ADAPTER_MODULE,
    ]
    assert paths == [
        "bsrkv.lmcache_ext.server",
        "bsrkv.lmcache_ext.faults.adapter",
        "bsrkv.lmcache_ext.adapters.mooncake",
    ]
    assert all(importlib.util.find_spec(p) is not None for p in paths)


def test_write_control_file_arms_the_fault_wrapper(tmp_path: Path) -> None:
    pytest.importorskip("lmcache")
    extensions.write_control_file(tmp_path / "f.json", [{"action": "drop", "phase": "lookup"}])
    assert json.loads((tmp_path / "f.json").read_text()) == {
        "rules": [{"action": "drop", "phase": "lookup"}]
    }
