"""Canonical KV bytes are a pure function of (salt, chunk hash, rank, tensor): a longer prefix
of one salt reuses the shorter one's L2 files, and the bytes never drift between versions."""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("lmcache")

from bsrctl.registration.tiny import tiny_llama_cpu  # noqa: E402
from bsrctl.stack.storage import CanonicalKV  # noqa: E402


def test_chunk_hashes_are_prefix_chained_and_salted() -> None:
    reg = tiny_llama_cpu()
    three = CanonicalKV(reg, "s0").chunk_hashes(3)
    assert [h.hex() for h in three] == [
        "507c25a126e3a33028a72631d40fb7f5",
        "6447c813c40269d1b35f11d9b778a419",
        "a4028fc84ee6577a65e4157dd6b39c53",
    ]
    assert CanonicalKV(reg, "s0").chunk_hashes(2) == three[:2]
    assert CanonicalKV(reg, "s1").chunk_hashes(1) != three[:1]


def test_object_bytes_are_pinned_and_per_rank() -> None:
    reg = tiny_llama_cpu(tp_size=2)
    canon = CanonicalKV(reg, "s0")
    (h,) = canon.chunk_hashes(1)
    r0, r1 = canon.object_bytes(h, 0, 0), canon.object_bytes(h, 1, 0)
    assert r0.size == r1.size == reg.group_bytes_per_chunk(0) == 131_072
    assert not (r0 == r1).all()
    assert (CanonicalKV(reg, "s0").object_bytes(h, 0, 0) == r0).all()
    one_rank = CanonicalKV(tiny_llama_cpu(), "s0")
    (h1,) = one_rank.chunk_hashes(1)
    digest = hashlib.sha256(one_rank.object_bytes(h1, 0, 0).tobytes()).hexdigest()
    assert digest == "2d66302904ceb2d252d7e3d4901ea22fab794c28a9089d60cd0f44ead1a92904"
