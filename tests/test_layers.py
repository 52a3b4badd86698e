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
import bsrkv

PACKAGE = Path(bsrctl.__file__).resolve().parent
ROOT = PACKAGE.parent
PYPROJECT = ROOT / "pyproject.toml"
# The two distributions' packages, as paths under the repository root.
PACKAGES = {"bsrctl": Path("bsrctl"), "bsrkv": Path("mechanisms") / "bsrkv"}
assert Path(bsrkv.__file__).resolve().parent == ROOT / PACKAGES["bsrkv"]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over ``root``'s bsrctl and bsrkv with ``root``/pyproject.toml."""
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
        env={"PYTHONPATH": f"{root}:{root / 'mechanisms'}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def _top_level(package: str) -> set[str]:
    """The package's top-level modules and subpackages, as dotted names."""
    top, *inner = package.split(".")
    root = ROOT / PACKAGES[top] / Path(*inner)
    names = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in root.glob("*/__init__.py")}
    return {f"{package}.{n}" for n in names}


def test_every_layer_contract_is_kept() -> None:
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in res.stdout


@pytest.mark.parametrize(
    ("contract", "sources", "package", "exempt"),
    [
        ("restore-core-pure", "forbidden_modules", "bsrkv", {"bsrkv.restore", "bsrkv.clock"}),
        ("evidence-leaf", "forbidden_modules", "bsrctl", {"bsrctl.evidence", "bsrctl.errors"}),
        ("evidence-leaf", "forbidden_modules", "bsrkv", {"bsrkv.atomic"}),
        (
            "typer-only-in-cli",
            "source_modules",
            "bsrctl",
            {"bsrctl.cli", "bsrctl.cli_timeline", "bsrctl.cli_evidence", "bsrctl.cli_fleet"},
        ),
        ("clock-bottom", "forbidden_modules", "bsrkv", {"bsrkv.clock"}),
        (
            "settings-low",
            "forbidden_modules",
            "bsrkv",
            {"bsrkv.settings", "bsrkv.restore", "bsrkv.clock"},
        ),
        (  # the wire's records are strictjson's
            "tempokv-wire-pure",
            "forbidden_modules",
            "bsrkv",
            {"bsrkv.tempokv", "bsrkv.clock", "bsrkv.strictjson"},
        ),
    ],
)
def test_the_contracts_name_every_top_level_module(contract, sources, package, exempt) -> None:
    # A new module under bsrctl/ or bsrkv/ must be placed in the layers, not slip past them.
    named = {m for m in _contracts()[contract][sources] if m.startswith(f"{package}.")}
    top = _top_level(package)
    missing = sorted(top - exempt - named)
    assert not missing, f"add {missing} to {sources} of contract {contract!r} in pyproject.toml"
    assert named <= top, f"{contract}: no such module {sorted(named - top)}"


@pytest.mark.parametrize(
    ("contract", "package"),
    [
        ("package-layers", "bsrctl"),
        ("mechanism-layers", "bsrkv"),
        ("lmcache-ext-parts", "bsrkv.lmcache_ext"),
    ],
)
def test_the_package_layers_name_every_top_level_module(contract, package) -> None:
    # exhaustive = true makes lint-imports refuse an unplaced module; this names which
    layers = _contracts()[contract]
    assert layers["containers"] == [package] and layers["exhaustive"] is True
    named = [f"{package}.{m.strip()}" for layer in layers["layers"] for m in layer.split("|")]
    assert len(named) == len(set(named)), f"a module placed twice: {sorted(named)}"
    top = _top_level(package)
    assert set(named) == top, (
        f"missing {sorted(top - set(named))}, unknown {sorted(set(named) - top)}"
    )


def test_the_tempokv_layers_place_every_module_of_the_package() -> None:
    # TempoKV's simulator, specs, measures, report and experiments: one package, layered
    layers = _contracts()["tempokv-layers"]
    assert layers["containers"] == ["bsrctl.tempokv"] and layers["exhaustive"] is True
    named = {m.strip() for layer in layers["layers"] for m in layer.split("|")}
    root = PACKAGE / "tempokv"
    top = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    assert named == top | {p.parent.name for p in root.glob("*/__init__.py")}


def test_the_stack_targets_contract_places_every_target_and_deployment() -> None:
    modules = {
        m.strip() for layer in _contracts()["stack-targets"]["layers"] for m in layer.split("|")
    }
    stack = PACKAGE / "stack"
    targets = {f"bsrctl.stack.{p.parent.name}.target" for p in stack.glob("*/target.py")}
    wanted = {"bsrctl.stack.selector", "bsrctl.stack.deployments", "bsrctl.stack.contracts"}
    wanted |= targets - {"bsrctl.stack.contracts.target"}  # the contract's own module
    assert modules == wanted


# (module, line appended to it, contracts it breaks (indirect imports count), the import named)
BREAKS = [
    (  # tempokv.spec embeds the deployment's StackSpec: specs -> settings -> the core
        "mechanisms/bsrkv/restore/plan.py",
        "import lmcache",
        {"restore-core-pure", "tempokv-no-stack"},
        "bsrkv.restore.plan -> lmcache",
    ),
    (  # the server's spans serving OTLP themselves: LMCache's process would hold a receiver
        "mechanisms/bsrkv/trace/spans.py",
        "import grpc",
        {"mechanisms-emit-spans"},
        "bsrkv.trace.spans -> grpc",
    ),
    (  # or the receiver's OTLP/HTTP server
        "mechanisms/bsrkv/trace/spans.py",
        "import http.server",
        {"mechanisms-emit-spans"},
        "bsrkv.trace.spans -> http",
    ),
    (  # the mechanisms reaching for the harness's collector (as the client's spans once did)
        "mechanisms/bsrkv/trace/spans.py",
        "from bsrctl.trace.collect import COLLECTOR",
        {"mechanisms-standalone", "mechanisms-emit-spans"},
        "bsrkv.trace.spans -> bsrctl.trace.collect",
    ),
    (
        "mechanisms/bsrkv/restore/admission.py",
        "from bsrkv.hostguard import Guard",
        {"restore-core-pure", "settings-low"},  # settings imports the core
        "bsrkv.restore.admission -> bsrkv.hostguard",
    ),
    (  # a mechanism reaching into the harness: LMCache's process would need bsrctl
        "mechanisms/bsrkv/restore/admission.py",
        "from bsrctl.errors import BadInput",
        {"mechanisms-standalone"},
        "bsrkv.restore.admission -> bsrctl.errors",
    ),
    (  # or one of the harness's libraries, which neither host brings
        "mechanisms/bsrkv/vllm_ext/transport.py",
        "import rich",
        {"mechanisms-standalone"},
        "bsrkv.vllm_ext.transport -> rich",
    ),
    (  # bsrctl.tempokv sits above the stack (its experiments run on it): its simulator and
        # specs, which import bsrkv.tempokv, are kept off the stack by tempokv-no-stack
        "mechanisms/bsrkv/tempokv/kv.py",
        "import bsrctl.stack",
        {"mechanisms-standalone", "tempokv-no-stack"},
        "bsrkv.tempokv.kv -> bsrctl.stack",
    ),
    (  # TempoKV's specs reaching for a deployment: only its experiments may
        "bsrctl/tempokv/spec.py",
        "import bsrctl.stack.launch.serving",
        {"tempokv-no-stack"},
        "bsrctl.tempokv.spec -> bsrctl.stack.launch.serving",
    ),
    (  # the simulator reaching up into the experiments that drive it
        "bsrctl/tempokv/sim/engine.py",
        "import bsrctl.tempokv.experiments.cells",
        {"tempokv-no-stack", "tempokv-layers", "acyclic"},
        "bsrctl.tempokv.sim.engine -> bsrctl.tempokv.experiments.cells",
    ),
    (  # TempoKV's report reading an experiment instead of the evidence
        "bsrctl/tempokv/report.py",
        "import bsrctl.tempokv.experiments.pooled",
        {"report-from-evidence", "tempokv-layers"},
        "bsrctl.tempokv.report -> bsrctl.tempokv.experiments.pooled",
    ),
    (  # or the simulator: below it in the package's layers, still not evidence
        "bsrctl/tempokv/report.py",
        "import bsrctl.tempokv.sim.run",
        {"report-from-evidence"},
        "bsrctl.tempokv.report -> bsrctl.tempokv.sim.run",
    ),
    (  # the report package finds TempoKV's renderer by name (evidence.kinds), never by import
        "bsrctl/report/units.py",
        "import bsrctl.tempokv.measures",
        {"package-layers", "acyclic"},  # tempokv.report imports report.units
        "bsrctl.report.units -> bsrctl.tempokv.measures",
    ),
    (
        "bsrctl/evidence/verdict.py",
        "import bsrkv.settings",
        {"evidence-leaf", "report-from-evidence"},  # report -> evidence -> settings -> core
        "bsrctl.evidence.verdict -> bsrkv.settings",
    ),
    (
        "mechanisms/bsrkv/tempokv/wire.py",
        "import lmcache",
        {"tempokv-no-stack", "tempokv-wire-pure"},
        "bsrkv.tempokv.wire -> lmcache",
    ),
    (  # the wire reads AdapterSettings (live.py) and CostModel (ttu.py): indirect counts
        "mechanisms/bsrkv/tempokv/ttu.py",
        "import vllm",
        {"tempokv-wire-pure"},
        "bsrkv.tempokv.ttu -> vllm",
    ),
    (  # the surface check reads vLLM's source: importing it would need torch and 10 s
        "mechanisms/bsrkv/hostsurface/source.py",
        "import vllm",
        {"hostsurface-reads-source"},
        "bsrkv.hostsurface.source -> vllm",
    ),
    (  # the vLLM adapter imports the wire: a wire that needs lmcache_ext is not lean
        "mechanisms/bsrkv/tempokv/wire.py",
        "import bsrkv.lmcache_ext.bsr.protocol",
        # and tempokv sits below lmcache_ext in the mechanisms' layers
        {"tempokv-no-stack", "tempokv-wire-pure", "vllm-ext-lean", "mechanism-layers", "acyclic"},
        "bsrkv.tempokv.wire -> bsrkv.lmcache_ext.bsr.protocol",
    ),
    (  # BSR's LMCache parts reaching up to TempoKV's, which stage through them
        "mechanisms/bsrkv/lmcache_ext/bsr/storage.py",
        "import bsrkv.lmcache_ext.tempokv.live",
        {"lmcache-ext-parts", "acyclic"},
        "bsrkv.lmcache_ext.bsr.storage -> bsrkv.lmcache_ext.tempokv.live",
    ),
    (  # TempoKV's parts reaching up to the server module that composes them
        "mechanisms/bsrkv/lmcache_ext/tempokv/live.py",
        "import bsrkv.lmcache_ext.server.state",
        {"lmcache-ext-parts", "acyclic"},
        "bsrkv.lmcache_ext.tempokv.live -> bsrkv.lmcache_ext.server.state",
    ),
    (  # the fault wrapper and TempoKV are strangers
        "mechanisms/bsrkv/lmcache_ext/faults/pump.py",
        "import bsrkv.lmcache_ext.tempokv.config",
        {"lmcache-ext-parts"},
        "bsrkv.lmcache_ext.faults.pump -> bsrkv.lmcache_ext.tempokv.config",
    ),
    (  # an L2 adapter knows nothing of BSR's restore
        "mechanisms/bsrkv/lmcache_ext/adapters/fileio.py",
        "import bsrkv.lmcache_ext.bsr.extensions",
        {"lmcache-ext-parts"},
        "bsrkv.lmcache_ext.adapters.fileio -> bsrkv.lmcache_ext.bsr.extensions",
    ),
    (  # the server module importing the fault wrapper it dispatches bsr.fault to
        "mechanisms/bsrkv/lmcache_ext/server/control.py",
        "import bsrkv.lmcache_ext.faults.control",
        {"server-without-faults"},
        "bsrkv.lmcache_ext.server.control -> bsrkv.lmcache_ext.faults.control",
    ),
    (  # the bsr.* wire importing the storage beside it: the client would need LMCache
        "mechanisms/bsrkv/lmcache_ext/bsr/protocol.py",
        "import bsrkv.lmcache_ext.bsr.storage",
        {"protocol-pure"},
        "bsrkv.lmcache_ext.bsr.protocol -> bsrkv.lmcache_ext.bsr.storage",
    ),
    (
        "bsrctl/stack/launch/process.py",
        "import typer",
        {"typer-only-in-cli"},
        "bsrctl.stack.launch.process -> typer",
    ),
    (
        "bsrctl/report/figures.py",
        "import bsrctl.stack.launch.process",
        {"report-from-evidence", "package-layers"},  # report and stack are siblings
        "bsrctl.report.figures -> bsrctl.stack.launch.process",
    ),
    (  # the upward arrow since removed: the spec models reaching up into the stack
        "bsrctl/specs.py",
        "import bsrctl.stack.launch.tinymodel",
        {"package-layers", "tempokv-no-stack", "acyclic"},  # tempokv.spec imports specs
        "bsrctl.specs -> bsrctl.stack.launch.tinymodel",
    ),
    (  # the circle since removed: the Target contract importing make_target's module
        "bsrctl/stack/contracts/target.py",
        "import bsrctl.stack.selector",
        {"stack-targets", "acyclic"},
        "bsrctl.stack.contracts.target -> bsrctl.stack.selector",
    ),
    (  # a deployment reaching up to the targets built on it
        "bsrctl/stack/contracts/deployment.py",
        "import bsrctl.stack.measure.target",
        {"stack-targets", "acyclic"},
        "bsrctl.stack.contracts.deployment -> bsrctl.stack.measure.target",
    ),
    (  # launching reaching up to the contracts, whose bsr.* client launches' pieces serve
        "bsrctl/stack/launch/serving/stack.py",
        "import bsrctl.stack.contracts.deployment",
        {"acyclic"},
        "- .launch -> .contracts (1 import)",
    ),
    (  # the circle between the serving cells and the cells of more than one request
        "bsrctl/experiments/failmatrix/scenarios.py",
        "import bsrctl.experiments.failmatrix.serving",
        {"acyclic"},
        "- .serving -> .scenarios (1 import)",
    ),
    (
        "bsrctl/report/restore.py",
        "import tests",
        {"no-tests-in-production"},
        "bsrctl.report.restore -> tests",
    ),
]


@pytest.mark.parametrize(("module", "line", "broken", "chain"), BREAKS)
def test_breaking_a_layer_fails_its_contract(tmp_path, module, line, broken, chain) -> None:
    for path in PACKAGES.values():
        shutil.copytree(ROOT / path, tmp_path / path, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # a deliberate layer break\n")
    res = _lint(tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    contracts = _contracts()
    for cid, c in contracts.items():
        verdict = "BROKEN" if cid in broken else "KEPT"
        assert f"{c['name']} {verdict}" in res.stdout, res.stdout
    assert chain in res.stdout, res.stdout
    assert f"Contracts: {len(contracts) - len(broken)} kept, {len(broken)} broken." in res.stdout
