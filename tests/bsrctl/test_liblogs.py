"""Library logs never reach the console: not the CLI's output, whenever the library's logger
was created (the cause of test_cli_errors' flakes: an LMCache INFO line in a CLI's output,
depending on which LMCache module was imported first, under which sys.stderr)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl import liblogs
from bsrctl.cli import app
from bsrctl.errors import BadInput

lmcache_logging = pytest.importorskip("lmcache.logging")


def console_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if type(h) is logging.StreamHandler]


def test_lmcache_lines_logged_during_a_command_stay_off_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    early = lmcache_logging.init_logger("lmcache.bsrctl_test_early")  # before any command
    if not console_handlers(early):  # routing is on already (an earlier test): as if not
        logging.Logger.addHandler(early, logging.StreamHandler())
    assert console_handlers(early)  # LMCache's own: a StreamHandler on stderr

    def report_that_logs(run_dir: Path) -> Path:
        # created while the command runs, under CliRunner's sys.stderr: the old flake
        late = lmcache_logging.init_logger("lmcache.bsrctl_test_late")
        for logger in (early, late, logging.getLogger("vllm.bsrctl_test")):
            logger.setLevel(logging.INFO)
            logger.info("an INFO line that must not reach the console")
            logger.warning("nor a WARNING")
        raise BadInput("run_dir: the one line this command prints")

    monkeypatch.setattr("bsrctl.report.write_summary", report_that_logs)
    (tmp_path / "evidence.json").write_text("{}")
    res = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert res.exit_code == 2
    assert res.output.splitlines() == ["error: run_dir: the one line this command prints"]
    late = logging.getLogger("lmcache.bsrctl_test_late")
    assert console_handlers(early) == console_handlers(late) == []


def test_library_lines_land_in_the_run_folder(tmp_path: Path) -> None:
    liblogs.capture()
    logger = lmcache_logging.init_logger("lmcache.bsrctl_test_file")
    logger.setLevel(logging.INFO)
    logger.info("before the run folder: kept, then written into it")
    with liblogs.into(tmp_path / "run") as folder:
        logger.info("inside the run")
        logging.getLogger("vllm.bsrctl_test_file").warning("a vLLM warning")
    logger.info("after: not in this run's file")
    lm = (folder / "lmcache.log").read_text()
    assert "before the run folder: kept" in lm and "inside the run" in lm
    assert "after: not in" not in lm
    assert "a vLLM warning" in (folder / "vllm.log").read_text()
    liblogs.ROUTER.backlog.clear()
