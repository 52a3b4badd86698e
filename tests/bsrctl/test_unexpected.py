"""An unexpected exception in any command: exit 3 (never 1, a FAIL verdict's code), exactly one
console line naming the command, the run's phase and the log file, and the traceback in that
log (the run's own folder inside a run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app

SMOKE = Path(__file__).parents[2] / "ladders" / "cpu-smoke.yaml"


class Boom(Exception):
    pass


def invoke(*args: str) -> tuple[int, list[str]]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, [ln for ln in res.output.splitlines() if ln.strip()]


def the_line(lines: list[str], step: str) -> Path:
    """The one line; the log it names."""
    assert len(lines) == 1, lines
    m = re.fullmatch(
        rf"error: unexpected Boom in {re.escape(step)}: it broke; traceback in (\S+)", lines[0]
    )
    assert m, lines[0]
    return Path(m.group(1))


def test_outside_a_run_the_traceback_goes_to_a_temporary_log(monkeypatch, tmp_path) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise Boom("it broke")

    monkeypatch.setattr("bsrctl.experiments.restore.sweep.run_sweep", broken)
    code, lines = invoke("sweep", str(SMOKE), "--out", str(tmp_path / "o"))
    assert code == 3
    log = the_line(lines, "sweep")
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "Boom: it broke" in text
    assert "in broken" in text  # the frame that raised


def test_inside_a_run_it_names_the_phase_and_the_run_log(monkeypatch, tmp_path) -> None:
    class Target:
        kind = "serving"
        on_phase = None

        def prepare(self, _prompts: list) -> None:
            raise Boom("it broke")

        def cleanup(self) -> None:
            pass

    monkeypatch.setattr("bsrctl.experiments.restore.sweep.make_target", lambda *_a: Target())
    code, lines = invoke("sweep", str(SMOKE), "--out", str(tmp_path / "o"))
    assert code == 3
    assert lines[:-1] == ["· preparing the serving stack (2 prompts)"]  # the run's progress
    log = the_line(lines[-1:], "sweep (preparing the serving stack (2 prompts))")
    run_dirs = list((tmp_path / "o").iterdir())
    assert len(run_dirs) == 1 and log == run_dirs[0] / "logs" / "bsrctl-error.log"
    assert "Boom: it broke" in log.read_text()


def test_a_stack_subcommand_is_named_by_its_path(monkeypatch, tmp_path) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise Boom("it broke")

    monkeypatch.setattr("bsrctl.stack.launch.status.status_from_state", broken)
    code, lines = invoke("stack", "status", "--run-dir", str(tmp_path))
    assert code == 3
    the_line(lines, "stack status")


@pytest.mark.parametrize("args", [["sweep", "/no/such.yaml", "--out", "x"], ["no-such-command"]])
def test_bad_input_and_usage_errors_keep_exit_2(args: list[str]) -> None:
    code, lines = invoke(*args)
    assert code == 2
    assert not any("unexpected" in ln for ln in lines)
