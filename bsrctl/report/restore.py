"""summary.md of a restore run (ladder, sweep, law, round trip), from its evidence alone."""

from __future__ import annotations

from typing import Any

MEASURE_ORDER = (
    "tokens", "window_chunks", "l1_capacity_bytes", "restore_pool_peak_bytes",
    "cached_tokens", "external_hit_tokens", "expected_cached_tokens", "ttft_s", "restore_s",
    "bytes_restored", "output_sha256", "canonical_sha256",
)  # fmt: skip


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str) and len(value) == 64:
        return value[:12]  # a sha256: its prefix is enough to compare by eye
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render(doc: dict[str, Any]) -> str:
    points = doc.get("points", [])
    # A measure no point has (None: not measured on this stack) gets no column.
    present = {k for p in points for k, v in p["measures"].items() if v is not None}
    keys = [k for k in MEASURE_ORDER if k in present]
    keys += sorted(present - set(keys))
    lines = [
        f"# {doc['run_id']} ({doc['kind']}): {doc['verdict']}",
        "",
        f"- complete: {doc['complete']}; started {doc['started_at']}; finished "
        f"{doc.get('finished_at')}",
        f"- stack: {doc['stack'].get('kind')}; salt `{doc['salt']}`; spec sha256 "
        f"`{doc['spec_sha256'][:12]}`",
    ]
    if doc.get("summary"):
        lines.append(f"- summary: {doc['summary']}")
    lines += ["", "| " + " | ".join(["point", "verdict", *keys]) + " |"]
    lines.append("|" + "---|" * (len(keys) + 2))
    for p in points:
        row = [p["id"], p["verdict"]] + [_cell(p["measures"].get(k, "")) for k in keys]
        lines.append("| " + " | ".join(row) + " |")
    names = list(dict.fromkeys(c["name"] for p in points for c in p["checks"]))
    if names:
        lines += ["", "| point | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
        for p in points:
            by = {c["name"]: c["verdict"] for c in p["checks"]}
            lines.append("| " + " | ".join([p["id"], *(by.get(n, "") for n in names)]) + " |")
    bad = [(p["id"], c) for p in points for c in p["checks"] if c["verdict"] != "PASS"]
    if bad:
        lines += ["", "## Not passing", ""]
        lines += [f"- {pid} / {c['name']}: {c['verdict']}: {c['detail']}" for pid, c in bad]
    return "\n".join(lines) + "\n"
