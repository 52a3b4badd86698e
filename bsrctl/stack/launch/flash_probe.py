"""The flash tier measured as a device: fio inside the tier's own cgroups (``FastTier``), on
the arena's loop device, with O_DIRECT (the page cache, so the fast tier, is never touched):

- ``demand_qd1``: 4 KiB random reads, one in flight (a fault of LMCache-DAX's retrieve);
- ``demand_qd4``: 4 KiB random reads, four in flight (libaio);
- ``staging``: 1 MiB sequential reads (TempoKV's staging pieces).

The demand rate is ``demand_qd1``'s bytes per second, the staging rate ``staging``'s; their
ratio is what the spec's ``demand_mib_s / flash_mib_s`` sets. fio's JSON is kept whole."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.stack.launch.fast_tier import FastTier

RUNTIME_S = 3.0  # per job, after RAMP_S: long enough that the throttle's slices average out
RAMP_S = 0.5
JOBS: dict[str, tuple[str, ...]] = {
    "demand_qd1": ("--rw=randread", "--bs=4k", "--ioengine=psync", "--iodepth=1"),
    "demand_qd4": ("--rw=randread", "--bs=4k", "--ioengine=libaio", "--iodepth=4"),
    "staging": ("--rw=read", "--bs=1m", "--ioengine=psync", "--iodepth=1"),
}


@dataclass(frozen=True)
class FlashFigures:
    """A flash tier's measured read paths (bytes/s, requests/s)."""

    demand_bytes_s: float  # 4 KiB at one in flight
    demand_qd4_bytes_s: float
    staging_bytes_s: float  # 1 MiB sequential
    demand_iops: float
    demand_qd4_iops: float

    @property
    def ratio(self) -> float:
        return self.demand_bytes_s / self.staging_bytes_s

    def to_json(self) -> dict[str, float]:
        return {**asdict(self), "ratio": self.ratio}


def fio_argv(job: str, device: str, size_bytes: int) -> list[str]:
    return ["fio", "--output-format=json", f"--name={job}", f"--filename={device}",
            "--direct=1", "--readonly", f"--size={size_bytes}", "--time_based",
            f"--runtime={RUNTIME_S}", f"--ramp_time={RAMP_S}", *JOBS[job]]  # fmt: skip


def read_figures(jobs: dict[str, dict[str, Any]]) -> FlashFigures:
    """The figures from each job's fio JSON (``jobs[0].read``: ``bw_bytes``, ``iops``)."""

    def read(name: str) -> dict[str, Any]:
        return jobs[name]["jobs"][0]["read"]

    d1, d4, st = read("demand_qd1"), read("demand_qd4"), read("staging")
    return FlashFigures(float(d1["bw_bytes"]), float(d4["bw_bytes"]), float(st["bw_bytes"]),
                        float(d1["iops"]), float(d4["iops"]))  # fmt: skip


def probe(tier: FastTier, timeout_s: float = 60.0) -> tuple[FlashFigures, dict[str, Any]]:
    """Every job, one after another, inside the tier's cgroups (the tier is up): the
    figures and fio's JSON per job. A missing fio or a job that fails is ``StackFailed``."""
    if shutil.which("fio") is None:
        raise StackFailed("flash probe: fio is not installed (apt-get install fio)")
    out: dict[str, Any] = {}
    for job in JOBS:
        argv = [*tier.join_prefix(), *fio_argv(job, tier.arena_path, tier.config.arena_bytes)]
        try:
            got = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise StackFailed(f"flash probe: fio {job} ran past {timeout_s} s") from None
        if got.returncode != 0:
            raise StackFailed(
                f"flash probe: fio {job} exited {got.returncode}: {got.stderr[-400:]}"
            )
        try:
            out[job] = json.loads(got.stdout[got.stdout.index("{") :])
        except ValueError:
            raise StackFailed(
                f"flash probe: fio {job} printed no JSON: {got.stdout[-400:]}"
            ) from None
    return read_figures(out), out
