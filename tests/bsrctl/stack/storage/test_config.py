"""A storage stack's config and faults are checked before anything is deployed."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lmcache")

from bsrctl.errors import BadInput  # noqa: E402
from bsrctl.registration.tiny import tiny_llama_cpu  # noqa: E402
from bsrctl.stack.storage import FAULT_KINDS, FaultSpec, StorageStackConfig  # noqa: E402


def test_unknown_values_are_bad_input(tmp_path: Path) -> None:
    reg = tiny_llama_cpu()
    one_of = r"one of \('verify', 'mmap', 'memory', 'null'\)"
    with pytest.raises(BadInput, match=r"destination 'disk': " + one_of):
        StorageStackConfig(tmp_path, reg, 1 << 20, destination="disk")
    with pytest.raises(BadInput, match="l2_adapter 'nfs'"):
        StorageStackConfig(tmp_path, reg, 1 << 20, l2_adapter="nfs")
    with pytest.raises(BadInput, match="l1_capacity_bytes=4095: at least 4096"):
        StorageStackConfig(tmp_path, reg, 4095)
    with pytest.raises(BadInput, match="fault kind 'crash'"):
        FaultSpec("crash", window=0)
    assert FAULT_KINDS == ("drop_key", "timeout", "install_error")
    assert FaultSpec("drop_key", 2, rank=1) == FaultSpec("drop_key", 2, 1, 0)


def test_a_mooncake_tier_needs_its_master_and_only_it_does(tmp_path: Path) -> None:
    reg = tiny_llama_cpu()
    fix = "mooncake_master: set it \\(host:port\\) exactly when l2_adapter is 'bsr_mooncake'"
    with pytest.raises(BadInput, match=fix):
        StorageStackConfig(tmp_path, reg, 1 << 20, l2_adapter="bsr_mooncake")
    with pytest.raises(BadInput, match=fix):
        StorageStackConfig(tmp_path, reg, 1 << 20, mooncake_master="127.0.0.1:50051")
    ok = StorageStackConfig(
        tmp_path, reg, 1 << 20, l2_adapter="bsr_mooncake", mooncake_master="127.0.0.1:50051"
    )
    assert (ok.l2_adapter, ok.mooncake_master) == ("bsr_mooncake", "127.0.0.1:50051")
