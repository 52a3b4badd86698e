"""bench/restore_bandwidth.py's pure parts (bench/bandwidth/): the round-robin order, the
median pass, the one results table, the worker's result across the process boundary, the
worker's command line and the last line's format. No stack is deployed."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest
from bandwidth import fio
from bandwidth.common import (
    GIB,
    Lookup,
    ModeFailed,
    Rounds,
    Row,
    Sample,
    TierResult,
    table,
)
from bandwidth.mooncake import ENTRY, read_worker, worker_argv
from bandwidth.summary import checksum_ratio, fio_ratio, last_line, no_checksum_label

from bsrctl.registration.dsv4 import dsv4_flash_mtp_off
from bsrctl.stats import paired_ratio_ci

BENCH = Path(__file__).resolve().parents[3] / "bench"

WINDOW = {"fetch_s": 0.01, "wait_s": 0.002, "install_s": 0.0005, "sync_s": 0.0001,
          "admit_wait_s": 0.0}  # fmt: skip


def tier(tokens: int, rates: dict[str, float], whole: float | None = None) -> TierResult:
    rows = [Row(label, 1.0, int(r * GIB), peak=100) for label, r in rates.items()]
    if whole is not None:
        rows.append(Row("whole-plan (W=0)", 1.0, int(whole * GIB), peak=900))
    base = "raw" if any(k.startswith("raw") for k in rates) else "client"
    return TierResult.of(tokens, rows, base, Lookup(0.001, 0.004))


def test_rounds_start_one_mode_later_each_round() -> None:
    rounds = Rounds()
    seen: list[str] = []
    for name in "abc":
        rounds.add(name, lambda name=name: seen.append(name) or Sample(1.0, 1))
    assert [rounds.order(r, 3) for r in range(3)] == [list("abc"), list("bca"), list("cab")]
    assert [rounds.order(r, 2) for r in range(2)] == [list("abc"), list("bca")]
    rounds.run(3)
    assert seen == list("abcbcacab")
    assert {k: len(v) for k, v in rounds.runs.items()} == {"a": 3, "b": 3, "c": 3}


def test_the_median_pass_keeps_its_own_fields() -> None:
    rounds = Rounds()
    passes = iter([Sample(3.0, 30, peak=3), Sample(1.0, 10, peak=1), Sample(2.0, 20, peak=2)])
    rounds.add("m", lambda: next(passes))
    rounds.run(3)
    assert rounds.median("m") == Sample(2.0, 20, peak=2)


def test_one_table_for_every_tier() -> None:
    rounds = Rounds()
    rounds.add("raw O_DIRECT readers=1", lambda: Sample(0.5, GIB))
    bsr = Sample(2.0, 2 * GIB, peak=1234, gauge_peak=1234, first_s=0.0125, windows=(WINDOW,) * 2,
                 read_ns=4_000_000_000, read_bytes=2 * GIB, peak_inflight=3)  # fmt: skip
    rounds.add("bsr W=8 B=16", lambda: bsr)
    rounds.run(1)
    lines: list[str] = []
    rows = table(lines.append, rounds)
    assert lines == [
        f"{'mode':52} {'s':>7} {'GiB/s':>6} {'first ms':>8} {'peak B/rank':>11}  runs GiB/s",
        f"{'raw O_DIRECT readers=1':52}   0.500   2.00 {'':8} {'':11}  [2.00]",
        f"{'bsr W=8 B=16':52}   2.000   1.00     12.5        1234  [1.00]",
        "    per window (n=2) fetch 10.0 wait 2.0 install 0.50 sync 0.10 admit 0.00 ms",
        "    adapter reads: 0.50 GiB/s per read in flight, 2.00 reads in flight on average "
        "(peak 3 per rank)",
    ]
    assert rows == [
        Row("raw O_DIRECT readers=1", 0.5, GIB),
        Row("bsr W=8 B=16", 2.0, 2 * GIB, 1234, 1234, 0.0125, 4_000_000_000, 2 * GIB, 3),
    ]


def test_the_worker_result_crosses_the_process_boundary() -> None:
    res = tier(8192, {"client get_into parallel=1": 1.0, "bsr W=8 B=16": 0.9})
    assert (res.best_raw_label, res.best_raw) == ("client get_into parallel=1", GIB)
    said: list[str] = []
    stdout = "# seeded 1 GiB\nmode ...\n" + __import__("json").dumps(res.to_json()) + "\n"
    assert read_worker(stdout, said.append) == res
    assert said == ["# seeded 1 GiB", "mode ..."]


def test_the_worker_gets_this_runs_flags_for_one_size() -> None:
    args = argparse.Namespace(tokens=[8192, 65536], windows=[8, 16], repeat=3,
                              mc_whole_max_gib=2.0, mc_parallel=[1, 2], mc_load_workers=1,
                              mc_load_workers_sweep=[1, 2])  # fmt: skip
    small, large = worker_argv(args, "10.0.0.1:50051", 8192), worker_argv(args, "m", 65536)
    assert small == [sys.executable, str(ENTRY), "--mooncake-worker", "10.0.0.1:50051",
                     "--tokens", "8192", "--windows", "8", "16", "--repeat", "3",
                     "--mc-whole-max-gib", "2.0", "--mc-parallel", "1", "2", "--conc", "1",
                     "--mc-load-workers-sweep", "1", "2"]  # fmt: skip
    assert large[-1] == "--mc-load-workers-sweep" and "65536" in large  # sweep: smallest only
    assert ENTRY == BENCH / "restore_bandwidth.py"


def test_last_line_format() -> None:
    goal = "bsr W=8 B=16"
    fs = [
        tier(8192, {"raw O_DIRECT readers=1": 2.0, goal: 1.5}, whole=1.2),
        tier(65536, {"raw O_DIRECT readers=1": 2.0, "raw O_DIRECT readers=4": 2.5, goal: 2.0}),
    ]
    mc = [tier(65536, {"client batch_get_into (8 objects/batch)": 4.0, goal: 3.0})]  # fmt: skip
    assert last_line(fs, mc, 8) == (
        "fs: bsr/best-raw=0.80 bsr/whole-plan=1.25 bsr/fio@8192=n/a bsr/fio@65536=n/a "
        "checksum/no-checksum=n/a mooncake: bsr/best-raw=0.75 peak_bytes=100"
    )
    assert last_line(fs[1:], [], 8) == (
        "fs: bsr/best-raw=0.80 bsr/whole-plan=n/a bsr/fio@65536=n/a checksum/no-checksum=n/a "
        "peak_bytes=100"
    )
    assert last_line([], mc, 8) == "mooncake: bsr/best-raw=0.75 peak_bytes=100"


def test_the_bench_deploys_paper_geometry_through_the_storage_target(tmp_path: Path) -> None:
    pytest.importorskip("lmcache")
    from bandwidth import stacks

    assert stacks.registration() == dsv4_flash_mtp_off(tp_size=2)
    t = stacks.target(tmp_path)
    assert (t.root, t.spec.storage.destination, t.l1_ranks) == (tmp_path, "null", 2)
    assert t.spec.memory_reserve_bytes == 4 * GIB
    assert (t.l2_adapter, stacks.target(tmp_path, "ns:1").l2_adapter) == ("bsr_fs", "bsr_mooncake")


def test_fio_reads_each_object_whole_one_job_per_object_size() -> None:
    dirs = {4096: Path("/l/objects-4096"), 1_351_680: Path("/l/objects-1351680")}
    assert fio.job_text(dirs, "io_uring", 8).splitlines() == [
        "[global]", "direct=1", "rw=read", "ioengine=io_uring", "iodepth=8", "thread",
        "file_service_type=sequential", "group_reporting",
        "[objects-4096]", "bs=4096", "opendir=/l/objects-4096",
        "[objects-1351680]", "bs=1351680", "opendir=/l/objects-1351680",
    ]  # fmt: skip
    assert fio.fio_argv("fio", Path("/j.fio")) == ["fio", "--readonly", "--output-format=json",
                                                    "/j.fio"]  # fmt: skip
    assert fio.label("libaio", 32) == "fio O_DIRECT libaio iodepth=32"


def test_fio_json_gives_its_own_runtime_and_bytes() -> None:
    job = '{"error": 0, "read": {"io_bytes": 3145728, "runtime": 250}}'
    out = 'note: a line before the JSON\n{"jobs": [' + job + "]}"
    assert fio.parse(out) == Sample(0.25, 3_145_728)
    with pytest.raises(RuntimeError, match="job error 5"):
        fio.parse('{"jobs": [{"error": 5, "read": {"io_bytes": 1, "runtime": 1}}]}')
    with pytest.raises(RuntimeError, match="read 0 B in 0 ms"):
        fio.parse('{"jobs": [{"error": 0, "read": {"io_bytes": 0, "runtime": 0}}]}')


def test_objects_are_classed_by_their_read_rounded_to_4_kib(tmp_path: Path) -> None:
    for name, size in (("a", 16_408_576), ("b", 1_351_680 + 100), ("c", 16_408_576)):
        (tmp_path / name).write_bytes(bytes(size))
    a, b, c = (tmp_path / n for n in "abc")
    classes = fio.size_classes([a, b, c])
    assert classes == {1_351_680: [b], 16_408_576: [a, c]}
    dirs = fio.link_classes(classes, tmp_path / "links")
    assert dirs == {bs: tmp_path / "links" / f"objects-{bs}" for bs in classes}
    big = sorted(dirs[16_408_576].iterdir())
    assert [p.name for p in big] == ["0", "1"]  # hard links: one inode with its object
    assert [p.stat().st_ino for p in big] == [a.stat().st_ino, c.stat().st_ino]
    fio.link_classes(classes, tmp_path / "links")  # again: the same links, none left over
    assert len(list(dirs[16_408_576].iterdir())) == 2
    (tmp_path / "d").write_bytes(bytes(100))
    with pytest.raises(ValueError, match="an object of 100 B is below one 4096 B block"):
        fio.size_classes([tmp_path / "d"])


@pytest.mark.skipif(fio.fio_binary() is None, reason="Debian's fio (make venv installs it)")
def test_real_fio_reads_every_byte_of_the_files(tmp_path: Path) -> None:
    paths = []
    for i, mib in enumerate((1, 1, 2)):
        paths.append(tmp_path / f"obj@{i}")
        paths[-1].write_bytes(bytes(range(256)) * 4096 * mib)
    binary = fio.fio_binary()
    assert binary is not None
    jobs = fio.FioJobs(binary, paths, tmp_path / "fio")
    assert {bs: len(f) for bs, f in jobs.classes.items()} == {1 << 20: 2, 2 << 20: 1}
    assert jobs.usable()["libaio"] is None  # ext4 under the test folder takes O_DIRECT
    got = fio.run_fio(jobs.argv("libaio", 4))
    assert got.bytes == 4 << 20 and got.s > 0


@pytest.mark.skipif(fio.fio_binary() is None, reason="Debian's fio (make venv installs it)")
def test_a_job_of_hundreds_of_objects_is_read_whole(tmp_path: Path) -> None:
    """512 objects of one size: their names listed in ``filename=`` passed fio's 4096
    character limit on an option value, and fio dropped the job (exit 1)."""
    paths = [tmp_path / f"object-key-of-some-length-{i:04d}" for i in range(512)]
    for p in paths:
        p.write_bytes(bytes(4096))
    binary = fio.fio_binary()
    assert binary is not None
    jobs = fio.FioJobs(binary, paths, tmp_path / "fio")
    assert fio.run_fio(jobs.argv("libaio", 8)).bytes == 512 * 4096


def test_a_failing_fio_is_one_line_naming_the_job_and_its_message(tmp_path: Path) -> None:
    fake = tmp_path / "fio"
    fake.write_text(
        "#!/bin/sh\necho 'value exceeds max length of 4096' >&2\n"
        "echo 'fio: job objects-1351680 dropped' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    with pytest.raises(ModeFailed) as e:
        fio.run_fio([str(fake), "job.fio"])
    assert str(e.value) == (
        "fio exit 1: fio: job objects-1351680 dropped value exceeds max length of 4096"
    )


def test_a_mode_that_fails_is_dropped_with_one_line_and_the_rest_go_on() -> None:
    said: list[str] = []
    calls = {"n": 0}

    def flaky() -> Sample:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ModeFailed("fio exit 1: fio: job objects-4096 dropped")
        return Sample(1.0, GIB)

    rounds = Rounds()
    rounds.add("bsr", lambda: Sample(0.5, GIB))
    rounds.add("fio", flaky)
    rounds.run(3, said.append)
    assert said == ["# fio: dropped in round 2 (fio exit 1: fio: job objects-4096 dropped)"]
    assert list(rounds.runs) == ["bsr"] and len(rounds.runs["bsr"]) == 3
    assert [label for label, _ in rounds.modes] == ["bsr"]


def test_bsr_over_fio_is_paired_by_round_against_the_best_fio_mode() -> None:
    goal = "bsr W=8 B=16"
    rows = [Row(goal, 1.0, 2 * GIB), Row("fio O_DIRECT libaio iodepth=1", 1.0, GIB),
            Row("fio O_DIRECT io_uring iodepth=8", 1.0, 2 * GIB)]  # fmt: skip
    samples = {goal: {"pass_s": [1.0, 1.0, 2.0]},
               "fio O_DIRECT libaio iodepth=1": {"pass_s": [1.0, 1.0, 1.0]},
               "fio O_DIRECT io_uring iodepth=8": {"pass_s": [1.0, 0.5, 1.0]}}  # fmt: skip
    res = TierResult(65536, tuple(rows), GIB, "raw", Lookup(0.001, 0.004), samples)
    # rounds: bsr 2, 2, 1 GiB/s against io_uring's 2, 4, 2: ratios 1, 0.5, 0.5
    assert fio_ratio(res, goal) == "bsr/fio=0.50 [0.50, 1.00]"
    one = TierResult(65536, tuple(rows), GIB, "raw", Lookup(0.001, 0.004),
                     {k: {"pass_s": v["pass_s"][:1]} for k, v in samples.items()})  # fmt: skip
    assert fio_ratio(one, goal) == "bsr/fio=1.00 [1 round: no interval]"


def test_the_checksum_cost_is_the_goal_row_with_over_without_paired_by_round() -> None:
    goal, bare = "bsr W=8 B=16", no_checksum_label(8)
    assert bare == "bsr W=8 B=16 no checksum"
    rows = [Row(goal, 1.0, 2 * GIB), Row(bare, 1.0, 2 * GIB)]
    # rounds: with the checksum 2, 1, 2 GiB/s against 2, 2, 2.5 without: 1, 0.5, 0.8
    samples = {goal: {"pass_s": [1.0, 2.0, 1.0]}, bare: {"pass_s": [1.0, 1.0, 0.8]}}
    res = TierResult(65536, tuple(rows), GIB, "raw", Lookup(0.001, 0.004), samples)
    iv = paired_ratio_ci([2.0, 1.0, 2.0], [2.0, 2.0, 2.5], 0)
    assert iv.estimate == 0.8
    assert checksum_ratio(res, 8) == f"checksum/no-checksum=0.80 [{iv.lo:.2f}, {iv.hi:.2f}]"
    gone = TierResult(65536, tuple(rows[:1]), GIB, "raw", Lookup(0.001, 0.004), samples)
    assert checksum_ratio(dataclasses.replace(gone, samples={goal: samples[goal]}), 8) == (
        "checksum/no-checksum=n/a"
    )
