"""Evidence as one pandas frame: a row per (point, sample), for notebooks, dashboards,
`bsrctl export`, `runs` and `compare`. The columns are documented in docs/evidence-table.md.

A point with ``samples`` (the repeated measures, in measurement order) gives one row per
sample index: a repeated measure's column holds that sample, a measure measured once holds
its one value on every row. A point without samples (all evidence before repeats) gives one
row, sample 0. Nested measure dicts flatten to ``a.b`` columns; lists become JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bsrctl.errors import BadInput
from bsrctl.evidence.record import load_evidence

# The run's and the point's own columns, in this order, before versions, params and measures.
RUN_COLUMNS = (
    "run_id", "kind", "spec_sha256", "spec_name", "stack_kind", "started_at", "finished_at",
    "complete", "run_verdict",
)  # fmt: skip
POINT_COLUMNS = ("point", "point_verdict", "sample", "n_samples")
FORMATS = ("csv", "parquet", "json")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and tuples become JSON text (one cell each)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            out[name] = json.dumps(value, default=str)
        else:
            out[name] = value
    return out


def run_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The run-level columns of one evidence document (one row of `bsrctl runs`)."""
    spec = doc.get("spec") or {}
    stack = doc.get("stack") or {}
    name = spec.get("name")
    fields = {
        "run_id": str(doc.get("run_id", "")),
        "kind": str(doc.get("kind", "?")),
        "spec_sha256": str(doc.get("spec_sha256", "")),
        "spec_name": name if isinstance(name, str) else "",
        "stack_kind": str(stack.get("kind", "?")),
        "started_at": str(doc.get("started_at") or ""),
        "finished_at": str(doc.get("finished_at") or ""),
        "complete": bool(doc.get("complete")),
        "run_verdict": str(doc.get("verdict", "UNKNOWN")),
    }
    fields.update(flatten(stack.get("versions") or {}, "version."))
    return fields


def _measure_column(name: str) -> str:
    # A measure never hides a run/point column or a prefixed family.
    taken = name in RUN_COLUMNS or name in POINT_COLUMNS
    family = name.split(".", 1)[0] in ("version", "param", "ci", "measure")
    return f"measure.{name}" if taken or family else name


def point_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one run: a row per point and sample index, in evidence order."""
    run = run_fields(doc)
    rows = []
    for point in doc.get("points", []):
        measures = flatten(point.get("measures") or {})
        samples = {k: list(v) for k, v in (point.get("samples") or {}).items()}
        intervals = point.get("intervals") or {}
        n = max((len(v) for v in samples.values()), default=1) or 1
        base = {
            **run,
            "point": str(point.get("id", "")),
            "point_verdict": str(point.get("verdict", "UNKNOWN")),
            "n_samples": n if samples else 1,
            **flatten(point.get("params") or {}, "param."),
        }
        cis = {}
        for name, pair in intervals.items():
            lo, hi = (list(pair) + [None, None])[:2]
            cis[f"ci.{name}.lo"], cis[f"ci.{name}.hi"] = lo, hi
        for i in range(n):
            row = {**base, "sample": i}
            values = dict(measures)
            for name, seq in samples.items():
                values[name] = seq[i] if i < len(seq) else None
            row.update({_measure_column(k): v for k, v in values.items()})
            row.update(cis)
            rows.append(row)
    return rows


def measure_columns(df: pd.DataFrame) -> list[str]:
    """The frame's measure columns: all but the run's, the point's, versions, params, cis."""
    fixed = {*RUN_COLUMNS, *POINT_COLUMNS, "path"}
    prefixes = ("version.", "param.", "ci.")
    return [c for c in df.columns if c not in fixed and not c.startswith(prefixes)]


def _ordered(columns: Iterable[str]) -> list[str]:
    cols = list(dict.fromkeys(columns))
    fixed = [c for c in (*RUN_COLUMNS, *POINT_COLUMNS) if c in cols]
    versions = sorted(c for c in cols if c.startswith("version."))
    params = [c for c in cols if c.startswith("param.")]
    cis = [c for c in cols if c.startswith("ci.")]
    rest = set(fixed) | set(versions) | set(params) | set(cis)
    return fixed + versions + params + [c for c in cols if c not in rest] + cis


def evidence_frame(docs: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One frame over the points of every document, in the order given."""
    rows = [row for doc in docs for row in point_rows(doc)]
    columns = _ordered(c for row in rows for c in row) if rows else [*RUN_COLUMNS, *POINT_COLUMNS]
    return pd.DataFrame(rows, columns=columns)


def read_docs(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Each run folder's evidence.json; a folder without one is bad input."""
    docs = []
    for run_dir in run_dirs:
        path = Path(run_dir) / "evidence.json"
        if not path.is_file():
            raise BadInput(f"{run_dir}: no evidence.json; pass a folder under reports/")
        try:
            docs.append(load_evidence(path))
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    return docs


def load_frame(run_dirs: Sequence[Path]) -> pd.DataFrame:
    return evidence_frame(read_docs(run_dirs))


def runs_frame(root: Path) -> pd.DataFrame:
    """A row per run folder directly under ``root`` (run columns, versions and ``path``);
    a file that cannot be read is skipped."""
    rows = []
    for ev in sorted(Path(root).glob("*/evidence.json")):
        try:
            doc = json.loads(ev.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        fields = run_fields(doc)
        fields["run_id"] = fields["run_id"] or ev.parent.name
        rows.append({**fields, "path": str(ev.parent)})
    return pd.DataFrame(rows, columns=_ordered([*RUN_COLUMNS, *(c for r in rows for c in r)]))


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Arrow needs one type per column: a column mixing types (a measure that is a number in
    one point and text in another) is written as text."""
    out = df.copy()
    for col in out.columns[out.dtypes == object]:  # noqa: E721 - pandas' object dtype
        kinds = {type(v) for v in out[col] if v is not None and not pd.isna(v)}
        if len(kinds) > 1:
            out[col] = [None if v is None or pd.isna(v) else str(v) for v in out[col]]
    return out


def write_frame(df: pd.DataFrame, fmt: str, out: Path | None) -> bytes | None:
    """Write ``df`` as csv, parquet or json (records) to ``out``; without ``out``, return
    the bytes (the CLI prints csv and json; parquet needs a file)."""
    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        if out is None:
            raise BadInput("--format parquet writes a binary file: give --out FILE")
        _parquet_safe(df).to_parquet(out, index=False)  # pyarrow
        return None
    text = (
        df.to_csv(index=False)
        if fmt == "csv"
        else df.to_json(orient="records", indent=1, force_ascii=False) + "\n"
    )
    if out is None:
        return text.encode()
    Path(out).write_text(text)
    return None
