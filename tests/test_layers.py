"""The layer rules (import-linter contracts in pyproject.toml) hold, and breaking one fails.

``lint-imports`` runs in a subprocess of this interpreter on the very tree under test
(grimp reads the sources; nothing is imported, no server runs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bsrctl

PACKAGE = Path(bsrctl.__file__).resolve().parent
ROOT = PACKAGE.parent
PYPROJECT = ROOT / "pyproject.toml"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over ``root``/bsrctl with ``root``/pyproject.toml."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
            "--no-cache",
            "--no-logo",
            str(root / "pyproject.toml"),
        ],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def _top_level() -> set[str]:
    """bsrctl's top-level modules and subpackages, as dotted names."""
    names = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    return {f"bsrctl.{n}" for n in names}


def test_every_layer_contract_is_kept() -> None:
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in res.stdout


@pytest.mark.parametrize(
    ("contract", "sources", "exempt"),
    [
        ("restore-core-pure", "forbidden_modules", {"bsrctl.restore", "bsrctl.clock"}),
        ("evidence-leaf", "forbidden_modules", {"bsrctl.evidence", "bsrctl.errors"}),
        (
            "typer-only-in-cli",
            "source_modules",
            {"bsrctl.cli", "bsrctl.cli_timeline", "bsrctl.cli_evidence", "bsrctl.cli_fleet"},
        ),
        ("clock-bottom", "forbidden_modules", {"bsrctl.clock"}),
        (
            "settings-low",
            "forbidden_modules",
            {"bsrctl.settings", "bsrctl.restore", "bsrctl.clock"},
        ),
        ("tempokv-wire-pure", "forbidden_modules", {"bsrctl.tempokv", "bsrctl.clock"}),
    ],
)
def test_the_contracts_name_every_top_level_module(contract, sources, exempt) -> None:
    # A new module under bsrctl/ must be placed in the layers, not slip past them.
    named = {m for m in _contracts()[contract][sources] if m.startswith("bsrctl.")}
    missing = sorted(_top_level() - exempt - named)
    assert not missing, f"add {missing} to {sources} of contract {contract!r} in pyproject.toml"
    assert named <= _top_level(), f"{contract}: no such module {sorted(named - _top_level())}"


def test_the_package_layers_name_every_top_level_module() -> None:
    # exhaustive = true makes lint-imports refuse an unplaced module; this names which
    layers = _contracts()["package-layers"]
    assert layers["containers"] == ["bsrctl"] and layers["exhaustive"] is True
    named = [f"bsrctl.{m.strip()}" for layer in layers["layers"] for m in layer.split("|")]
    assert len(named) == len(set(named)), f"a module placed twice: {sorted(named)}"
    assert set(named) == _top_level(), (
        f"missing {sorted(_top_level() - set(named))}, unknown {sorted(set(named) - _top_level())}"
    )


def test_the_stack_targets_contract_places_every_target_and_deployment() -> None:
    modules = {
        m.strip() for layer in _contracts()["stack-targets"]["layers"] for m in layer.split("|")
    }
    stack = PACKAGE / "stack"
    wanted = {
        f"bsrctl.stack.{p.stem}"
        for p in stack.glob("*.py")
        if p.stem.endswith("_target") or p.stem in ("selector", "target", "deployment")
    } | {"bsrctl.stack.launched", "bsrctl.stack.attached"}
    assert modules == wanted


# (module, line appended to it, contracts it breaks (indirect imports count), the import named)
BREAKS = [
    (  # tempokv.spec embeds the deployment's StackSpec: specs -> settings -> the core
        "restore/plan.py",
        "import lmcache",
        {"restore-core-pure", "tempokv-no-stack"},
        "bsrctl.restore.plan -> lmcache",
    ),
    (
        "restore/admission.py",
        "from bsrctl.errors import BadInput",
        {"restore-core-pure", "settings-low"},  # settings imports the core
        "bsrctl.restore.admission -> bsrctl.errors",
    ),
    (
        "tempokv/kv.py",
        "import bsrctl.stack",
        # tempokv sits below the stack, which imports it: a circle in bsrctl too
        {"tempokv-no-stack", "package-layers", "acyclic"},
        "bsrctl.tempokv.kv -> bsrctl.stack",
    ),
    (
        "evidence/verdict.py",
        "import bsrctl.settings",
        # report -> evidence -> settings -> core; evidence and settings are siblings
        {"evidence-leaf", "report-from-evidence", "package-layers"},
        "bsrctl.evidence.verdict -> bsrctl.settings",
    ),
    (
        "tempokv/wire.py",
        "import lmcache",
        {"tempokv-no-stack", "tempokv-wire-pure"},
        "bsrctl.tempokv.wire -> lmcache",
    ),
    (  # the wire reads AdapterSettings (live.py) and CostModel (ttu.py): indirect counts
        "tempokv/ttu.py",
        "import vllm",
        {"tempokv-wire-pure"},
        "bsrctl.tempokv.ttu -> vllm",
    ),
    (  # the vLLM adapter imports the wire: a wire that needs lmcache_ext is not lean
        "tempokv/wire.py",
        "import bsrctl.lmcache_ext.protocol",
        # and tempokv sits below lmcache_ext in the package's layers
        {"tempokv-no-stack", "tempokv-wire-pure", "vllm-ext-lean", "package-layers", "acyclic"},
        "bsrctl.tempokv.wire -> bsrctl.lmcache_ext.protocol",
    ),
    ("stack/process.py", "import typer", {"typer-only-in-cli"}, "bsrctl.stack.process -> typer"),
    (
        "report/figures.py",
        "import bsrctl.stack.process",
        {"report-from-evidence", "package-layers"},  # report and stack are siblings
        "bsrctl.report.figures -> bsrctl.stack.process",
    ),
    (  # the upward arrow since removed: the spec models reaching up into the stack
        "specs.py",
        "import bsrctl.stack.tinymodel",
        {"package-layers", "tempokv-no-stack", "acyclic"},  # tempokv.spec imports specs
        "bsrctl.specs -> bsrctl.stack.tinymodel",
    ),
    (  # the circle since removed: the Target contract importing make_target's module
        "stack/target.py",
        "import bsrctl.stack.selector",
        {"stack-targets", "acyclic"},
        "bsrctl.stack.target -> bsrctl.stack.selector",
    ),
    (  # a deployment reaching up to the targets built on it
        "stack/deployment.py",
        "import bsrctl.stack.running_target",
        {"stack-targets", "acyclic"},
        "bsrctl.stack.deployment -> bsrctl.stack.running_target",
    ),
    (  # the circle between the serving cells and the cells of more than one request
        "experiments/failmatrix/scenarios.py",
        "import bsrctl.experiments.failmatrix.serving",
        {"acyclic"},
        "- .serving -> .scenarios (1 import)",
    ),
    (
        "report/restore.py",
        "import tests",
        {"no-tests-in-production"},
        "bsrctl.report.restore -> tests",
    ),
]


@pytest.mark.parametrize(("module", "line", "broken", "chain"), BREAKS)
def test_breaking_a_layer_fails_its_contract(tmp_path, module, line, broken, chain) -> None:
    shutil.copytree(PACKAGE, tmp_path / "bsrctl", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    target = tmp_path / "bsrctl" / module
    target.write_text(target.read_text() + f"\n{line}  # a deliberate layer break\n")
    res = _lint(tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    contracts = _contracts()
    for cid, c in contracts.items():
        verdict = "BROKEN" if cid in broken else "KEPT"
        assert f"{c['name']} {verdict}" in res.stdout, res.stdout
    assert chain in res.stdout, res.stdout
    assert f"Contracts: {len(contracts) - len(broken)} kept, {len(broken)} broken." in res.stdout
