"""`bsrctl fleet report RUN…`: runs of one spec from many nodes, side by side.

- a node × experiment verdict grid (a node of ``--nodes`` with no run reads MISSING);
- for each key metric (``bsrctl.report.compare.KEY_METRICS``) at each point, its
  distribution across nodes, the outliers named by the robust z-score of Iglewicz and
  Hoaglin, ``z = 0.6745 (x - median) / MAD``, flagged at ``|z| > 3.5`` (the median absolute
  deviation, as hyperfine's outlier warning uses; where MAD is 0, the mean absolute
  deviation stands in, ``z = (x - median) / (1.253314 MeanAD)``; both 0: no outlier);
- each node against its own previous run (``--baseline``), through ``compare``.

A node's value at a point is the median of its samples. Runs of different specs are refused
as ``compare`` refuses them. A node is a folder holding its runs (br-*/evidence.json one
level down) or a run folder itself; its name is its folder's, or that of ``node.json``'s
``node`` where the folder has one (the nightly's artifacts do).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bsrctl.errors import BadInput
from bsrctl.evidence import load_evidence
from bsrctl.evidence.table import evidence_frame
from bsrctl.report.compare import KEY_METRICS, Bound, Comparison, Incomparable, compare

CUTOFF = 3.5  # Iglewicz & Hoaglin (1993): |modified z| > 3.5 is a potential outlier
MISSING = "MISSING"


@dataclass(frozen=True)
class NodeRun:
    node: str
    run_dir: Path
    doc: dict[str, Any]


@dataclass(frozen=True)
class Outlier:
    node: str
    kind: str
    point: str
    metric: str
    value: float
    median: float
    score: float


@dataclass(frozen=True)
class Spread:
    kind: str
    point: str
    metric: str
    values: tuple[tuple[str, float], ...]  # (node, value), in node order
    median: float
    mad: float
    outliers: tuple[Outlier, ...]


@dataclass(frozen=True)
class Baseline:
    node: str
    kind: str
    comparison: Comparison | None
    note: str  # why there is no comparison, else ""


@dataclass(frozen=True)
class FleetReport:
    nodes: tuple[str, ...]
    runs: tuple[NodeRun, ...]
    grid: dict[str, dict[str, str]]  # node -> kind -> verdict
    spreads: tuple[Spread, ...]
    baselines: tuple[Baseline, ...]

    @property
    def kinds(self) -> list[str]:
        return sorted({r.doc["kind"] for r in self.runs})

    @property
    def outliers(self) -> list[Outlier]:
        return [o for s in self.spreads for o in s.outliers]

    @property
    def regressed(self) -> list[Baseline]:
        return [b for b in self.baselines if b.comparison is not None and b.comparison.regressed]

    @property
    def passed(self) -> bool:
        """Every node's every experiment PASS, none missing, no regression."""
        cells = [v for row in self.grid.values() for v in row.values()]
        return all(v == "PASS" for v in cells) and not self.regressed


def robust_scores(values: Sequence[float]) -> list[float]:
    """Iglewicz-Hoaglin modified z-scores (MAD; MeanAD where MAD is 0; 0 where both are)."""
    x = np.asarray(values, dtype=float)
    med = float(np.median(x))
    dev = np.abs(x - med)
    mad = float(np.median(dev))
    if mad > 0:
        return [float(v) for v in 0.6745 * (x - med) / mad]
    mean_ad = float(np.mean(dev))
    if mean_ad > 0:
        return [float(v) for v in (x - med) / (1.253314 * mean_ad)]
    return [0.0] * len(x)


def _runs_in(folder: Path) -> list[Path]:
    if (folder / "evidence.json").is_file():
        return [folder]
    return sorted(p.parent for p in folder.glob("*/evidence.json"))


def _node_name(folder: Path) -> str:
    meta = folder / "node.json"
    if meta.is_file():
        return str(json.loads(meta.read_text())["node"])
    return folder.name


def discover(folders: Sequence[Path]) -> tuple[list[str], list[NodeRun]]:
    """The nodes (in the order given) and their runs; a node folder may hold no run (its
    node is then MISSING in the grid), never two runs of one kind."""
    nodes: list[str] = []
    runs: list[NodeRun] = []
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise BadInput(f"{folder}: no such folder; pass node folders (or run folders)")
        found = _runs_in(folder)
        is_run = found == [folder]
        node = _node_name(folder.parent if is_run else folder)
        if node in nodes:
            raise BadInput(f"{folder}: node {node!r} given twice; pass one folder per node")
        nodes.append(node)
        kinds: set[str] = set()
        for run_dir in found:
            doc = load_evidence(run_dir / "evidence.json")
            if doc["kind"] in kinds:
                raise BadInput(f"{folder}: two {doc['kind']} runs of node {node}; keep one")
            kinds.add(doc["kind"])
            runs.append(NodeRun(node, run_dir, doc))
    return nodes, runs


def _one_spec(runs: Sequence[NodeRun]) -> None:
    shas = {r.doc["spec_sha256"] for r in runs}
    if len(shas) > 1:
        which = ", ".join(f"{r.node}: {r.doc['spec_sha256'][:12]}" for r in runs)
        raise Incomparable(
            f"the runs have different specs ({which}): a fleet report takes runs of one spec"
        )


def _node_values(runs: Sequence[NodeRun]) -> Any:
    """(kind, point, node) -> metric -> the median of the node's samples there."""
    frame = pd.concat([evidence_frame([r.doc]).assign(node=r.node) for r in runs])
    metrics = [m for m in KEY_METRICS if m in frame.columns]
    numeric = frame[metrics].apply(lambda c: c.map(_number))
    numeric[["kind", "point", "node"]] = frame[["kind", "point", "node"]]
    return numeric.groupby(["kind", "point", "node"], sort=False).median(), metrics


def _number(v: Any) -> float:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    return float(v) if ok else math.nan


def spreads(runs: Sequence[NodeRun]) -> list[Spread]:
    if not runs:
        return []
    table, metrics = _node_values(runs)
    out = []
    for (kind, point), rows in table.groupby(level=["kind", "point"], sort=False):
        for metric in metrics:
            col = rows[metric].dropna()
            if col.empty:
                continue
            values = tuple((str(k[2]), float(v)) for k, v in col.items())
            x = [v for _, v in values]
            med = float(np.median(x))
            mad = float(np.median([abs(v - med) for v in x]))
            found = tuple(
                Outlier(node, str(kind), str(point), metric, v, med, z)
                for (node, v), z in zip(values, robust_scores(x), strict=True)
                if abs(z) > CUTOFF
            )
            out.append(Spread(str(kind), str(point), metric, values, med, mad, found))
    return out


def baselines(
    runs: Sequence[NodeRun], baseline: Path | None, bounds: Sequence[Bound]
) -> list[Baseline]:
    """Each run against the same node's run of its kind under ``baseline`` (shaped as the
    runs are: a folder per node)."""
    if baseline is None:
        return []
    before: dict[tuple[str, str], NodeRun] = {}
    if baseline.is_dir():
        folders = [p for p in sorted(baseline.iterdir()) if p.is_dir() and _runs_in(p)]
        for r in discover(folders)[1] if folders else []:
            before[(r.node, r.doc["kind"])] = r
    out = []
    for r in runs:
        base = before.get((r.node, r.doc["kind"]))
        if base is None:
            out.append(Baseline(r.node, r.doc["kind"], None, "no previous run"))
            continue
        try:
            result = compare(base.doc, r.doc, list(bounds))
        except Incomparable as exc:  # a changed spec starts a new baseline
            out.append(Baseline(r.node, r.doc["kind"], None, f"not compared: {exc}"))
            continue
        except ValueError as exc:  # a bound on a metric no point measures: a broken gate
            raise BadInput(str(exc)) from None
        out.append(Baseline(r.node, r.doc["kind"], result, ""))
    return out


def fleet_report(
    folders: Sequence[Path],
    baseline: Path | None = None,
    bounds: Sequence[Bound] = (),
    expected: Sequence[str] = (),
) -> FleetReport:
    """The report over node folders; ``expected`` (a nodes file's names) adds a MISSING row
    for each node that brought no folder."""
    nodes, runs = discover(folders)
    _one_spec(runs)
    nodes += [n for n in expected if n not in nodes]
    kinds = sorted({r.doc["kind"] for r in runs})
    grid = {n: dict.fromkeys(kinds or ["run"], MISSING) for n in nodes}
    for r in runs:
        grid[r.node][r.doc["kind"]] = str(r.doc["verdict"])
    return FleetReport(
        tuple(nodes),
        tuple(runs),
        grid,
        tuple(spreads(runs)),
        tuple(baselines(runs, baseline, bounds)),
    )
