"""Fixtures for the BSR core tests over LMCache's real in-process StorageManager.

Geometry: TP = 2, two groups, 16-token chunks, one 4 KiB object per (chunk, rank, group)
(16 x 64 float32), so c = 8192 B per rank and L1 allocations (4 KiB-aligned) are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bsrctl.registration import GroupSpec, Registration, TensorSpec
from bsrctl.settings import RestoreSettings

pytest.importorskip("lmcache")

from bsrctl.stack.storage import StorageStack, StorageStackConfig, deploy  # noqa: E402

CHUNK_TOKENS = 16


def small_registration(tp_size: int = 2, aux_bytes: int = 0) -> Registration:
    tensors = (
        TensorSpec("layers.0.kv", (CHUNK_TOKENS, 64), "float32", 0),
        TensorSpec("layers.0.index", (CHUNK_TOKENS, 64), "float32", 1),
    )
    groups = (GroupSpec(0, "attention"), GroupSpec(1, "indexer"))
    return Registration("bsr-test", tensors, groups, tp_size, CHUNK_TOKENS, aux_bytes)


@pytest.fixture(scope="module")
def reg() -> Registration:
    return small_registration()


def make_stack(root: Path, reg: Registration, l1_chunks: int) -> StorageStack:
    return deploy(
        StorageStackConfig(
            root_dir=root,
            registration=reg,
            l1_capacity_bytes=l1_chunks * reg.bytes_per_chunk,
            restore=RestoreSettings(window_timeout_s=10.0),
        )
    )


@pytest.fixture
def stack_factory(tmp_path: Path, reg: Registration) -> Iterator[object]:
    """make(l1_chunks) -> a stack under tmp_path; torn down after the test."""
    made: list[StorageStack] = []

    def make(l1_chunks: int) -> StorageStack:
        made.append(make_stack(tmp_path / f"s{len(made)}", reg, l1_chunks))
        return made[-1]

    yield make
    for s in made:
        s.teardown()


@pytest.fixture(scope="module")
def big_stack(
    tmp_path_factory: pytest.TempPathFactory, reg: Registration
) -> Iterator[StorageStack]:
    """L1 of 64 chunks per rank: room for any window/budget the properties draw."""
    stack = make_stack(tmp_path_factory.mktemp("bsr-big"), reg, 64)
    yield stack
    stack.teardown()
