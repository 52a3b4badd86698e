"""bsrctl's LMCache extensions as the stacks load them: built from RestoreSettings, the module
path a parameter (the failure matrix's mutants), nothing else naming bsrctl.lmcache_ext."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bsrctl.settings import RestoreSettings
from bsrctl.stack import extensions
from bsrctl.stack.extensions import BSR_SERVER_MODULE, bsr_extensions

BSR = Path(extensions.__file__).parents[1]


def test_bsr_server_module_from_the_restore_settings() -> None:
    s = RestoreSettings(window_chunks=4, load_concurrency=3, checksum=False)
    ext = bsr_extensions(s)
    assert ext.server_module.to_json() == {
        "module_path": "bsrctl.lmcache_ext.server_module",
        "factory_name": "build_server_modules",
        "config": {
            "window_chunks": 4,
            "admission_budget_chunks": 4,  # B = W when unset
            "window_timeout_s": 30.0,
            "probe_timeout_s": 10.0,
            "admission_timeout_s": 120.0,
            "retrieve_deadline_s": 45.0,
            "drain_timeout_s": 5.0,
            "stall_guard_s": 5.0,
        },
    }
    assert list(ext.server_module.config) == list(extensions.SERVER_KEYS)
    assert (ext.load_concurrency, ext.checksum, ext.retrieve_deadline_s) == (3, False, 45.0)


def test_another_module_is_a_parameter() -> None:
    s = RestoreSettings(window_chunks=2, admission_budget_chunks=6)
    real = bsr_extensions(s).server_module.to_json()
    mutant = bsr_extensions(
        s, module_path="bsrctl.lmcache_ext.failmatrix_mutants", extra_config={"mutations": ["x"]}
    ).server_module.to_json()
    assert mutant["module_path"] == "bsrctl.lmcache_ext.failmatrix_mutants"
    assert mutant["config"] == {**real["config"], "mutations": ["x"]}
    assert real["config"]["admission_budget_chunks"] == 6


def test_the_json_is_a_fresh_copy_each_time() -> None:
    ext = bsr_extensions(RestoreSettings())
    first = ext.server_module.to_json()
    first["config"]["mutations"] = ["y"]
    assert "mutations" not in ext.server_module.to_json()["config"]


def test_only_this_module_names_the_lmcache_extensions_in_the_stack() -> None:
    naming = sorted(
        str(p.relative_to(BSR))
        for p in (BSR / "stack").rglob("*.py")
        if any(
            line.lstrip().startswith(("from bsrctl.lmcache_ext", "import bsrctl.lmcache_ext"))
            or '"bsrctl.lmcache_ext.' in line
            for line in p.read_text().splitlines()
        )
    )
    assert naming == ["stack/extensions.py"]
    assert BSR_SERVER_MODULE == "bsrctl.lmcache_ext.server_module"


def test_write_control_file_arms_the_fault_wrapper(tmp_path: Path) -> None:
    pytest.importorskip("lmcache")
    extensions.write_control_file(tmp_path / "f.json", [{"action": "drop", "phase": "lookup"}])
    assert json.loads((tmp_path / "f.json").read_text()) == {
        "rules": [{"action": "drop", "phase": "lookup"}]
    }
