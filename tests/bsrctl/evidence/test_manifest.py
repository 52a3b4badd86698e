"""manifest.json and `bsrctl verify`: one flipped byte in any file of a run folder, a file
added and a file removed are each named; an untouched folder verifies."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.evidence.manifest import add_to_manifest, verify, write_manifest


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "br-e1-000000000001"
    (d / "logs").mkdir(parents=True)
    (d / "evidence.json").write_text('{"points": []}\n')
    (d / "summary.md").write_text("# run\n")
    (d / "logs" / "lmcache.log").write_text("a line\n" * 100)
    (d / "storage" / "l2").mkdir(parents=True)  # scratch: L2 tier files are not recorded
    (d / "storage" / "l2" / "obj").write_bytes(b"\0" * 10)
    write_manifest(d)
    return d


def test_an_untouched_folder_verifies(run_dir: Path) -> None:
    res = verify(run_dir)
    assert (res.ok, res.checked) == (True, 3)
    cli = CliRunner().invoke(app, ["verify", str(run_dir)])
    assert (cli.exit_code, cli.output) == (0, "ok: 3 files match manifest.json\n")


@pytest.mark.parametrize("name", ["evidence.json", "summary.md", "logs/lmcache.log"])
@pytest.mark.parametrize("at", [0, -1])
def test_one_flipped_byte_in_any_file_is_named(run_dir: Path, name: str, at: int) -> None:
    path = run_dir / name
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    assert verify(run_dir).changed == [name]
    cli = CliRunner().invoke(app, ["verify", str(run_dir)])
    assert (cli.exit_code, cli.output) == (1, f"changed: {name}\n")


def test_a_file_added_and_a_file_removed_are_named(run_dir: Path) -> None:
    (run_dir / "logs" / "extra.log").write_text("x")
    (run_dir / "summary.md").unlink()
    res = verify(run_dir)
    assert (res.changed, res.appeared, res.vanished) == ([], ["logs/extra.log"], ["summary.md"])
    cli = CliRunner().invoke(app, ["verify", str(run_dir)])
    assert cli.exit_code == 1
    assert cli.output == "appeared: logs/extra.log\nvanished: summary.md\n"


def test_renderings_join_the_record_and_tampering_still_shows(run_dir: Path) -> None:
    (run_dir / "evidence.json").write_text('{"points": [1]}\n')  # tampered after the run
    (run_dir / "report.html").write_text("<html></html>")
    add_to_manifest(run_dir, [run_dir / "report.html"])
    res = verify(run_dir)
    assert (res.changed, res.appeared) == (["evidence.json"], [])


def test_verify_without_a_manifest_is_bad_input(tmp_path: Path) -> None:
    cli = CliRunner().invoke(app, ["verify", str(tmp_path)])
    assert cli.exit_code == 2 and "no manifest.json" in cli.output
