"""The failure-matrix spec: the shipped matrices load, and every wrong input is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsrctl.errors import BadInput
from bsrctl.experiments.failmatrix import FAULTS, load_matrix, run_matrix

MATRICES = Path(__file__).parents[3] / "matrices"

BASE = """\
stack:
  mooncake: {{enabled: true}}
restore: {{window_timeout_s: 8}}
workload: {{prompt_tokens: 4000, window_chunks: 4}}
cells:
{cells}
"""


def write(tmp_path: Path, cells: str, base: str = BASE) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(base.format(cells=cells))
    return p


def test_shipped_matrices_load_with_every_issue_cell() -> None:
    cpu, _ = load_matrix(MATRICES / "cpu.yaml")
    not_in_cpu_yaml = {"storage_window_timeout", "storage_node_partitioned", "storage_node_lost"}
    whole = next(c for c in cpu.cells if c.fault == "whole_plan_past_l1")
    assert whole.tokens(4000) // 256 * cpu.bytes_per_chunk() > cpu.stack.lmcache.l1_size_bytes
    conc = next(c for c in cpu.cells if c.fault == "concurrent_restores")
    assert conc.mix() == [1024, 2048, 3072, 4000] * 4
    assert {c.fault for c in cpu.cells} == set(FAULTS) - not_in_cpu_yaml
    assert [c.id for c in cpu.cells][-1] == "lmcache-killed-mid-restore"  # destructive last
    two, _ = load_matrix(MATRICES / "cpu-two-hosts.yaml")
    assert {"storage_node_partitioned", "storage_node_lost"} <= {c.fault for c in two.cells}
    assert [c.id for c in two.cells][-1] == "storage-node-lost"
    paper, _ = load_matrix(MATRICES / "paper.yaml")
    assert [c.fault for c in paper.cells] == [
        "mooncake_master_down",
        "mooncake_and_fs_absent",
        "rank_keys_dropped",
    ]


@pytest.mark.parametrize(
    ("cells", "needle"),
    [
        ("  - {id: a, fault: nope, expect: recompute}", "cells.0.fault"),
        ("  - {id: a, fault: window_timeout, expect: recompute, colour: red}", "unknown field"),
        (
            "  - {id: a, fault: window_timeout, at: before_request, expect: recompute}",
            "injected at",
        ),
        ("  - {id: a, fault: window_timeout, window: 4, expect: recompute}", "out of range"),
        (
            "  - {id: a, fault: l1_exhausted, at: between_windows, window: 3, expect: closed}",
            "out of range",
        ),
        (
            "  - {id: a, fault: l1_exhausted, at: between_windows, hold_s: 9, expect: closed}",
            "hold_s 9.0 must be below",
        ),
        ("  - {id: a, fault: window_timeout, expect: lower_tier}", "lower_tier needs"),
        (
            "  - {id: a, fault: window_timeout, expect: recompute}\n"
            "  - {id: a, fault: window_timeout, expect: recompute}",
            "unique",
        ),
        ("  - {id: a, fault: rank_keys_dropped, rank: 2, expect: recompute}", "tp_ranks"),
        ("  - {id: A B, fault: window_timeout, expect: recompute}", "cells.0.id"),
        ("  - {id: a, fault: load_fails_always, source: all, expect: recompute}", "one tier"),
        ("  - {id: a, fault: slow_tier, expect: closed}", "source fs or mooncake, expect"),
        ("  - {id: a, fault: slow_tier, delay_s: 8, expect: recompute}", "must exceed"),
        # the default L1 (1 GiB) holds 4000 tokens: not a whole plan past L1
        (
            "  - {id: a, fault: whole_plan_past_l1, at: before_request, expect: closed}",
            "prompt_tokens 4000 is 15 chunks = 3932160 B, within stack.lmcache.l1_size_bytes",
        ),
        (
            "  - {id: a, fault: whole_plan_past_l1, at: before_request, expect: recompute}",
            "needs source fs and expect closed",
        ),
        (
            "  - {id: a, fault: concurrent_restores, at: before_request, expect: restored}",
            r"requests 16 > stack.vllm.max_num_seqs 4",
        ),
        (
            "  - {id: a, fault: concurrent_restores, at: before_request, requests: 4, "
            "mix_tokens: [1024, 20480], expect: restored}",
            "mix_tokens 20480 \\+ workload.max_tokens exceeds stack.vllm.max_model_len 20480",
        ),
        (
            "  - {id: a, fault: concurrent_restores, at: before_request, requests: 1, "
            "expect: restored}",
            "cells.0.requests",
        ),
        (
            "  - {id: a, fault: mooncake_master_restarted, at: before_request, expect: recompute}",
            "needs source mooncake and expect recompute",
        ),
        ("  - {id: a, fault: window_timeout, expect: restored}", "restored is concurrent_"),
    ],
)
def test_bad_cells_are_bad_input(tmp_path: Path, cells: str, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        load_matrix(write(tmp_path, cells))


def test_mooncake_cells_need_mooncake(tmp_path: Path) -> None:
    base = BASE.replace("  mooncake: {{enabled: true}}\n", "  vllm: {{}}\n")
    cells = "  - {id: a, fault: mooncake_master_down, at: before_request, expect: recompute}"
    with pytest.raises(BadInput, match="mooncake.enabled"):
        load_matrix(write(tmp_path, cells, base))


def test_serving_cells_need_bsr_on(tmp_path: Path) -> None:
    base = BASE.replace("window_chunks: 4", "window_chunks: 0")
    with pytest.raises(BadInput, match="workload.window_chunks"):
        load_matrix(write(tmp_path, "  - {id: a, fault: window_timeout, expect: recompute}", base))


def test_empty_matrix_is_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text("cells: []\n")
    with pytest.raises(BadInput, match="cells"):
        load_matrix(p)


def test_run_refuses_unknown_stack_and_cell(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="--stack"):
        run_matrix(MATRICES / "cpu.yaml", tmp_path, "sim", lambda _: None)
    with pytest.raises(BadInput, match="valid: window-timeout"):
        run_matrix(MATRICES / "cpu.yaml", tmp_path, "storage", lambda _: None, only=["nope"])
    assert list(tmp_path.iterdir()) == []  # nothing started, no run folder


STORAGE_CELL = "  - {id: r, fault: rank_keys_dropped, window: %d, rank: 1, expect: recompute}"


def test_storage_windows_follow_the_stacks_chunk_size(tmp_path: Path) -> None:
    """4096 prefix tokens, W = 2: 8 windows of 256-token chunks, 16 of 128-token chunks."""
    at_256, _ = load_matrix(write(tmp_path, STORAGE_CELL % 7))
    base = BASE.replace(
        "  mooncake: {{enabled: true}}\n",
        "  mooncake: {{enabled: true}}\n  lmcache: {{chunk_size: 128}}\n",
    )
    at_128, _ = load_matrix(write(tmp_path, STORAGE_CELL % 15, base))
    assert (at_256.storage_windows(), at_128.storage_windows()) == (8, 16)
    with pytest.raises(BadInput, match="window 8 >= 8 windows of the storage prefix"):
        load_matrix(write(tmp_path, STORAGE_CELL % 8))


PARTITION = (
    "  - {id: p, fault: storage_node_partitioned, at: between_windows, window: 1, hold_s: 3, "
    "source: SOURCE, expect: recompute}"
)


@pytest.mark.parametrize("fault", ["storage_node_partitioned", "storage_node_lost"])
@pytest.mark.parametrize(
    ("topology", "source", "ok"),
    [("two-hosts", "mooncake", True), ("one-host", "mooncake", False),
     ("two-hosts", "fs", False)],
)  # fmt: skip
def test_partition_cell_needs_two_hosts_and_the_mooncake_source(
    tmp_path: Path, topology: str, source: str, ok: bool, fault: str
) -> None:
    base = BASE.replace("{{enabled: true}}", f"{{{{enabled: true, topology: {topology}}}}}")
    cell = PARTITION.replace("SOURCE", source).replace("storage_node_partitioned", fault)
    path = write(tmp_path, cell, base)
    if ok:
        spec, _ = load_matrix(path)
        assert spec.stack.mooncake.topology == "two-hosts"
        return
    with pytest.raises(BadInput, match="needs stack.mooncake.topology: two-hosts and source"):
        load_matrix(path)


def test_unknown_topology_is_bad_input(tmp_path: Path) -> None:
    base = BASE.replace("{{enabled: true}}", "{{enabled: true, topology: three-hosts}}")
    with pytest.raises(BadInput, match="stack.mooncake.topology"):
        load_matrix(write(tmp_path, PARTITION.replace("SOURCE", "mooncake"), base))
