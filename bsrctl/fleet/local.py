"""`bsrctl fleet run SPEC --local N`: a stand-in for a cluster on one machine, for tests and
laptops. It renders the manifests of N local nodes (as `fleet render` does), runs each Job's
own command line as a separate process (`python -m bsrctl.cli ARGS`, the Job's paths mapped
onto DIR), each in its own folder with its own storage root, then merges them with the fleet
report. Only the in-process storage stack runs here: N serving stacks would need N GPUs.

Layout: DIR/node-I/ (node.json, bsrctl.log, result.json, the run's br-* folder, its storage
root), DIR/.fleet/ (the spec every node runs, the rendered manifests), DIR/report.md,
DIR/report.html and the figures beside them; `bsrctl fleet report DIR/*/` sees the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import bsrctl
import bsrkv
from bsrctl.errors import BadInput
from bsrctl.fleet.manifests import RESULTS_DIR, SPEC_DIR, new_run_id, render
from bsrctl.fleet.nodes import Node, NodesFile, Results
from bsrctl.spec_io import read_yaml

STORAGE_ROOT = "storage"  # relative: each node's process runs in its own folder


@dataclass(frozen=True)
class LocalNode:
    name: str
    folder: Path
    returncode: int


def fleet_spec(spec: Path, to: Path) -> Path:
    """The spec every node runs: the given one with ``storage.root_dir`` relative (so every
    node's run has the same spec, sha256 included, and its own root) and a registration
    file's path made absolute (the processes do not run where it was given)."""
    doc = read_yaml(spec)
    reg = doc.get("registration")
    if isinstance(reg, str) and Path(reg).is_file():
        doc["registration"] = str(Path(reg).resolve())
    doc["storage"] = {**(doc.get("storage") or {}), "root_dir": STORAGE_ROOT}
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_text(yaml.safe_dump(doc, sort_keys=False))
    return to


def local_nodes(n: int, out: Path, command: str) -> NodesFile:
    return NodesFile(
        fleet="local",
        image="bsrctl:local",
        command=command,  # type: ignore[arg-type]
        results=Results(host_path=out),
        nodes=[Node(name=f"node-{i}", node_name="localhost") for i in range(n)],
    )


def _argv(job: Mapping[str, Any], spec: Path, out: Path, run_id: str) -> list[str]:
    """The Job's container args with its paths mapped onto this machine."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    mapped = {f"{SPEC_DIR}/spec.yaml": str(spec)}
    results = f"{RESULTS_DIR}/{run_id}/"
    return [
        mapped.get(a, str(out / a[len(results) :]) if a.startswith(results) else a)
        for a in container["args"]
    ]


def run_local(
    spec: Path,
    n: int,
    out: Path,
    command: str = "sweep",
    faults: Mapping[int, Path] | None = None,
) -> list[LocalNode]:
    """Run the N nodes at once; ``faults`` maps a node index to a fault-rules file put on
    its FS tier (``{"rules": [...]}``, bsrkv/lmcache_ext/faults/rules.py)."""
    if n < 1:
        raise BadInput(f"--local {n}: run at least one node")
    faults = dict(faults or {})
    bad = sorted(i for i in faults if not 0 <= i < n)
    if bad:
        raise BadInput(f"--node-faults: nodes {bad} are not among 0..{n - 1}")
    out = out.resolve()
    meta = out / ".fleet"
    run_id = new_run_id()
    fspec = fleet_spec(spec, meta / "spec.yaml")
    nodes = local_nodes(n, out, command)
    written = render(fspec, nodes, meta / "manifests", run_id, "storage")
    jobs = [yaml.safe_load(p.read_text()) for p in written if p.name.startswith("job-")]
    env = dict(os.environ)
    # this bsrctl and these mechanisms, from any folder
    here = [str(Path(m.__file__).resolve().parents[1]) for m in (bsrctl, bsrkv)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*here, env.get("PYTHONPATH")) if p)
    procs = []
    for i, (node, job) in enumerate(zip(nodes.nodes, jobs, strict=True)):
        folder = out / node.name
        (folder / STORAGE_ROOT).mkdir(parents=True, exist_ok=True)
        (folder / "node.json").write_text(json.dumps({"node": node.name, "run_id": run_id}))
        if i in faults:
            rules = json.loads(Path(faults[i]).read_text())
            if not isinstance(rules, dict) or "rules" not in rules:
                raise BadInput(f'{faults[i]}: write {{"rules": [...]}} (fault rules)')
            (folder / STORAGE_ROOT / "faults-fs.json").write_text(json.dumps(rules))
        argv = [sys.executable, "-m", "bsrctl.cli", *_argv(job, fspec, out, run_id)]
        with open(folder / "result.json", "wb") as so, open(folder / "bsrctl.log", "wb") as se:
            procs.append((node.name, folder, subprocess.Popen(argv, cwd=folder, env=env,
                                                              stdout=so, stderr=se)))  # fmt: skip
    return [LocalNode(name, folder, p.wait()) for name, folder, p in procs]
