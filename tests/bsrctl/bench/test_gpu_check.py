"""bench/gpu_check.py on a CPU machine: the paper's geometry and sizes, the memory plan for an
H200 node, the commands it would run (they parse: restore_gpu.py runs them here and says it
has no CUDA), the watchdog that bounds a silent size, and the dry run's exact output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gpu_check
import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"

GIB = 1 << 30
C = 16_408_576
ALLOCATED = (1 << 24) + (1 << 21) + (1 << 22)  # 12.7 MB, 1.35 MB, 2.38 MB rounded up
NO_CUDA = "restore_gpu: no CUDA device here; the GPU figure does not exist. Exit 0."


def test_the_papers_geometry_and_sizes() -> None:
    got = gpu_check.sizes(gpu_check.PAPER_SIZES)
    assert [s.chunks for s in got] == [128, 256, 512, 1024, 1536, 2047]
    assert [s.h2d_bytes for s in got] == [n * 2 * C for n in (128, 256, 512, 1024, 1536, 2047)]
    assert [s.host_bytes for s in got] == [
        n * 2 * ALLOCATED for n in (128, 256, 512, 1024, 1536, 2047)
    ]
    assert got[-1].h2d_bytes == 67_176_710_144  # 62.56 GiB per restore at 524,032 tokens
    assert gpu_check.pow2ceil(12_681_216) == 1 << 24 and gpu_check.pow2ceil(1 << 21) == 1 << 21


def test_the_plan_fits_memory() -> None:
    every = gpu_check.sizes(gpu_check.PAPER_SIZES)
    run, skipped = gpu_check.plan(every, 125 * GIB, 139 * GIB)  # an H200 node
    assert ([s.tokens for s in run], skipped) == (list(gpu_check.PAPER_SIZES), [])
    run, skipped = gpu_check.plan(every, 64 * GIB, 30 * GIB)
    assert [s.tokens for s in run] == [32768, 65536, 131072]
    assert skipped == [
        "262144: pool 31.3 GiB > 90% of 30.0 GiB free GPU memory",
        "393216: pinned 66.0 GiB > 80% of 64.0 GiB available host memory",
        "524032: pinned 88.0 GiB > 80% of 64.0 GiB available host memory",
    ]


def test_the_dry_run_prints_the_plan_and_runs_nothing() -> None:
    res = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--dry-run", "--host-mem-gib", "125",
         "--gpu-mem-gib", "139", "--tokens", "65536", "32768"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    cmd = f"{sys.executable} {BENCH / 'restore_gpu.py'}"
    assert (res.returncode, res.stdout.splitlines()) == (
        0,
        [
            "gpu_check: deepseek-v4-flash-mtp-off: c=16408576 B/chunk/rank, 3 groups, TP 2, "
            "256-token chunks, W 8 32",
            "gpu_check: 125.0 GiB host memory available, 139.0 GiB GPU free",
            "gpu_check: plan 32768 tokens: N=128, 3.91 GiB per restore, 5.50 GiB pinned: "
            f"{cmd} --tokens 32768 --windows 8 32 --repeat 3",
            "gpu_check: plan 65536 tokens: N=256, 7.82 GiB per restore, 11.00 GiB pinned: "
            f"{cmd} --tokens 65536 --windows 8 32 --repeat 3",
            "gpu_check: dry run, 2 size(s) planned within 450 s",
        ],
    ), res.stderr


def test_without_cuda_restore_gpu_runs_its_command_and_says_so() -> None:
    """Here (no GPU) the check runs restore_gpu.py once with the smallest size's arguments:
    they parse (argparse would exit 2) and its no-CUDA line is the last line. The host's
    memory is given: what is free here moves with whatever else runs (6.3 GiB beside the
    suite's vLLMs skipped 32768 for host memory before the GPU's turn came)."""
    res = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), "--budget-s", "120",
         "--host-mem-gib", "125"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    lines = res.stdout.splitlines()
    if "GiB GPU free" in lines[1] and not lines[1].endswith(" 0.0 GiB GPU free"):
        pytest.skip("a GPU here: the check would really run")
    assert res.returncode == 0, res.stdout + res.stderr
    assert lines[-1] == NO_CUDA
    assert lines[-2] == "gpu_check: 1 size(s) in " + lines[-2].split(" in ")[1]
    assert "gpu_check: skip 32768: pool 3.9 GiB > 90% of 0.0 GiB free GPU memory" in lines


def test_a_size_that_prints_nothing_is_killed_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(gpu_check, "command", lambda size, repeat: silent)
    size = gpu_check.sizes((32768,))[0]
    rc, last, took = gpu_check.run_one(size, 3, timeout_s=1.0)
    assert (rc, last, took) == (124, "restore_gpu 32768: past its 1 s", 1.0)
    ok = [sys.executable, "-c", "print('table'); print('gpu: bsr W=32/whole-plan=0.99')"]
    monkeypatch.setattr(gpu_check, "command", lambda size, repeat: ok)
    rc, last, _ = gpu_check.run_one(size, 3, timeout_s=60.0)
    assert (rc, last) == (0, "gpu: bsr W=32/whole-plan=0.99")
