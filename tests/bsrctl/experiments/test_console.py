"""The run console: one line per point with its verdict; quiet keeps only those; json shows
nothing; on a terminal a live line with point i of n, the step, MiB restored, elapsed, ETA."""

from __future__ import annotations

import io

from rich.console import Console

from bsrctl.experiments.console import Mode, RunConsole, point_line

MIB = 1 << 20
POINT = {
    "id": "n2048-w2",
    "verdict": "PASS",
    "measures": {
        "restore_pool_peak_bytes": MIB // 2,
        "rws_bound_bytes": MIB // 2,
        "cached_tokens": 2048,
        "expected_cached_tokens": 2048,
        "ttft_s": 0.0123,
        "restore_s": 0.0041,
        "bytes_restored": 2 * MIB,
    },
    "checks": [{"name": "canonical_output", "verdict": "PASS"}],
}


def recorded(mode: Mode, terminal: bool = False) -> tuple[RunConsole, io.StringIO]:
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=terminal, width=200, color_system=None)
    return RunConsole(mode, con), buf


def test_point_line_reads_in_mib_ms_and_tokens() -> None:
    assert point_line(POINT) == (
        "peak 0.50 MiB (W·c+aux 0.50) · cached 2048/2048 tok · TTFT 12.3 ms · restore 4.1 ms"
    )
    bad = {**POINT, "checks": [{"name": "canonical_output", "verdict": "FAIL"}]}
    assert point_line(bad).endswith("not passing: canonical_output")


def test_quiet_keeps_only_the_point_lines() -> None:
    rc, buf = recorded(Mode.QUIET)
    rc("deploying")
    rc.expect(2)
    rc.point(POINT)
    (line,) = buf.getvalue().splitlines()
    assert line.startswith("[1/2] n2048-w2 PASS peak 0.50 MiB") and ", ETA " in line


def test_rich_without_a_terminal_prints_phases_as_lines() -> None:
    rc, buf = recorded(Mode.RICH)
    rc("deploying: L1 8388608 B, W = 2")
    rc.step("seed")  # steps show on the live line only
    rc.point(POINT)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "· deploying: L1 8388608 B, W = 2"
    assert lines[1].startswith("[1] n2048-w2 PASS")


def test_json_prints_nothing() -> None:
    rc, buf = recorded(Mode.JSON)
    rc("deploying")
    rc.point(POINT)
    assert buf.getvalue() == ""


def test_a_terminal_gets_the_live_progress_line() -> None:
    rc, buf = recorded(Mode.RICH, terminal=True)
    rc.expect(4)
    rc("N = 2048 tokens, W = 2")
    rc.step("restore")
    assert rc.live is not None
    task = rc.live.tasks[0]
    assert (task.description, task.total) == ("N = 2048 tokens, W = 2 · restore", 4)
    rc.point(POINT)
    assert rc.live.tasks[0].completed == 1
    assert rc.live.tasks[0].fields["moved"] == "2.0 MiB restored"
    rc.close()
    assert rc.live is None
    assert "[1/4] n2048-w2 PASS" in buf.getvalue()
