"""LMCache 0.5.6's own L2-adapter checks (``lmcache.v1.check``, mode ``test_l2_adapter``)
run against bsrctl's adapters, beside the stock FS adapter they must match: absent lookups,
a batch store, present lookups, loads whose bytes equal what was stored. Then close()
twice, which LMCache's own adapters tolerate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmcache")

from lmcache.v1.check.check_mode_test_l2_adapter import (  # noqa: E402
    _create_l1_memory_desc,
    _test_single_adapter,
)
from lmcache.v1.check.utils import DEFAULT_OBJ_SIZE  # noqa: E402
from lmcache.v1.distributed.l2_adapters import create_l2_adapter  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    parse_args_to_l2_adapters_config,
)

import bsrkv.lmcache_ext.faults.adapter  # noqa: E402,F401  registers bsr_fs, bsr_fault

KEYS = 5


def specs(base: Path) -> dict[str, dict]:
    return {
        "stock fs": {"type": "fs", "base_path": str(base / "stock")},
        "bsr_fs": {
            "type": "bsr_fs",
            "base_path": str(base / "bsr"),
            "checksum": True,
            "load_concurrency": 4,
        },
        "bsr_fault verify": {
            "type": "bsr_fault",
            "name": "lmcache-checks",
            "verify": True,
            "inner": {"type": "bsr_fs", "base_path": str(base / "fault")},
        },
        "bsr_fault plugin": {
            "type": "plugin",
            "module_path": "bsrkv.lmcache_ext.faults.adapter",
            "class_name": "BsrFaultL2Adapter",
            "adapter_params": {
                "name": "lmcache-checks-plugin",
                "inner": {"type": "fs", "base_path": str(base / "plugin")},
            },
        },
    }


@pytest.mark.parametrize("name", ["stock fs", "bsr_fs", "bsr_fault verify", "bsr_fault plugin"])
def test_lmcache_l2_adapter_checks_pass_and_close_twice(name: str, tmp_path: Path, capsys) -> None:
    import argparse

    spec = specs(tmp_path)[name]
    (cfg,) = parse_args_to_l2_adapters_config(
        argparse.Namespace(l2_adapter=[json.dumps(spec)])
    ).adapters
    l1 = torch.empty(2 * KEYS * DEFAULT_OBJ_SIZE, dtype=torch.float32)
    adapter = create_l2_adapter(cfg, l1_memory_desc=_create_l1_memory_desc(l1))
    try:
        _test_single_adapter(adapter, "bsr-check-model", KEYS, l1_buffer=l1)
    finally:
        adapter.close()
    adapter.close()
    out = capsys.readouterr().out
    got = re.findall(r"Validation(?: \((\w+)\))?: (\d+)/(\d+)", out)
    assert [(what, int(n), int(of)) for what, n, of in got] == [
        ("", KEYS, KEYS),  # absent keys reported absent
        ("", KEYS, KEYS),  # stored keys found
        ("loaded", KEYS, KEYS),
        ("content", KEYS, KEYS),
    ], out
    assert "Batch store OK" in out
