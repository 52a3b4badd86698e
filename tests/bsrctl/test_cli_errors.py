"""Bad input: one line naming the field or cause and the fix, exit code 2, no process left."""

import socket
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.stack.launch.process import free_port

runner = CliRunner()


def children() -> set[int]:
    return {c.pid for c in psutil.Process().children(recursive=True)}


def run(*args: str) -> tuple[int, str]:
    """Invoke the CLI in-process; it must not leave a process behind, whatever happened."""
    before = children()
    res = runner.invoke(app, list(args))
    assert children() - before == set()
    return res.exit_code, res.output


def spec(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def assert_bad_input(code: int, output: str, *needles: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2, output
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_field_lists_the_valid_ones(tmp_path: Path) -> None:
    code, out = run("roundtrip", str(spec(tmp_path, "prompt_tokenz: 10\n")), "--out", str(tmp_path))
    assert_bad_input(code, out, "prompt_tokenz: unknown field", "valid fields here: stack,")


def test_mistyped_nested_field(tmp_path: Path) -> None:
    code, out = run(
        "roundtrip", str(spec(tmp_path, "stack:\n  lmcache:\n    l1_size: 5\n")), "--out", "x"
    )
    assert_bad_input(code, out, "stack.lmcache.l1_size: unknown field", "l1_size_bytes")


def test_negative_size(tmp_path: Path) -> None:
    text = "stack:\n  lmcache:\n    l1_size_bytes: -1\n"
    code, out = run("roundtrip", str(spec(tmp_path, text)), "--out", str(tmp_path))
    assert_bad_input(code, out, "stack.lmcache.l1_size_bytes", "greater than 0", "got -1")


def test_wrong_literal(tmp_path: Path) -> None:
    code, out = run("roundtrip", str(spec(tmp_path, "tiers: [l1, ssd]\n")), "--out", "x")
    assert_bad_input(code, out, "tiers.1:", "'l1', 'fs' or 'mooncake'")


def test_missing_file(tmp_path: Path) -> None:
    code, out = run("roundtrip", str(tmp_path / "nope.yaml"), "--out", str(tmp_path))
    assert_bad_input(code, out, "nope.yaml does not exist", "pass the path")


def test_prompt_longer_than_the_model_allows(tmp_path: Path) -> None:
    text = "prompt_tokens: 9000\nstack:\n  vllm:\n    max_model_len: 8192\n"
    code, out = run("roundtrip", str(spec(tmp_path, text)), "--out", str(tmp_path))
    assert_bad_input(code, out, "exceeds stack.vllm.max_model_len = 8192", "raise max_model_len")


def test_port_in_use_fails_before_anything_starts(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        text = f"stack:\n  vllm:\n    port: {port}\n"
        code, out = run("roundtrip", str(spec(tmp_path, text)), "--out", str(tmp_path / "r"))
    assert_bad_input(code, out, f"stack.vllm.port: port {port}", "choose a free port")
    assert not (tmp_path / "r").exists()  # nothing was started, nothing written


def test_report_of_a_folder_without_evidence(tmp_path: Path) -> None:
    code, out = run("report", str(tmp_path))
    assert_bad_input(code, out, "no evidence.json")


def test_stack_down_without_state(tmp_path: Path) -> None:
    code, out = run("stack", "down", "--run-dir", str(tmp_path))
    assert_bad_input(code, out, "no stack state")


@pytest.mark.parametrize(
    ("ladder", "stack", "field"),
    [
        ("tempokv-fig4.yaml", "storage", "--stack"),  # no TempoKV on the storage stack
        ("tempokv-fig1.yaml", "serving", "experiment.kind"),  # serving runs the grid only
    ],
)
def test_tempokv_rejects_unavailable_stacks(
    tmp_path: Path, ladder: str, stack: str, field: str
) -> None:
    pytest.importorskip("bsrctl.tempokv.experiments")
    path = Path(__file__).parents[2] / "ladders" / ladder
    code, out = run("tempokv", str(path), "--stack", stack, "--out", str(tmp_path))
    assert_bad_input(code, out, field)


def test_soak_bad_spec_and_bad_duration(tmp_path: Path) -> None:
    shipped = Path(__file__).parents[2] / "matrices" / "soak-cpu.yaml"
    code, out = run("soak", str(shipped), "--duration", "0", "--out", str(tmp_path / "r"))
    assert_bad_input(code, out, "--duration: 0 s", "e.g. 180")
    text = shipped.read_text().replace("concurrency: 3", "concurency: 3")
    code, out = run("soak", str(spec(tmp_path, text)), "--out", str(tmp_path / "r"))
    assert_bad_input(code, out, "soak.concurency: unknown field", "concurrency")
    assert not (tmp_path / "r").exists()  # nothing started, nothing written
