"""summary.md of a bench run (kind ``bench``), from its evidence alone: the bench and its
arguments, then one row per mode with each sampled measure's median and 95 % interval."""

from __future__ import annotations

from typing import Any

from bsrctl.report.units import header, table


def _value(point: dict[str, Any], key: str) -> str:
    v = (point.get("measures") or {}).get(key)
    iv = (point.get("intervals") or {}).get(key)
    if not isinstance(v, int | float):
        return "" if v is None else str(v)
    if iv:
        return f"{v:.4g} [{iv[0]:.4g}, {iv[1]:.4g}]"
    return f"{v:.4g}"


def render(doc: dict[str, Any]) -> str:
    spec = doc.get("spec") or {}
    lines = header(doc, f"bench {spec.get('bench', '?')}")
    args = ", ".join(f"{k} {v}" for k, v in spec.items() if k != "bench")
    lines += ["", f"Arguments: {args or 'none'}."]
    points = doc.get("points", [])
    sampled = list(dict.fromkeys(k for p in points for k in (p.get("samples") or {})))
    if points:
        lines += ["", "## Modes (median [95 % CI] over the samples)", ""]
        rows = [
            [p["id"], p["verdict"], str(p.get("repeats", 1)), *(_value(p, k) for k in sampled)]
            for p in points
        ]
        lines += table(["mode", "verdict", "samples", *sampled], rows)
    checks = (doc.get("summary") or {}).get("checks", [])
    if checks:
        lines += ["", "## Run checks", ""]
        lines += [f"- {c['name']}: {c['verdict']}: {c.get('detail', '')}" for c in checks]
    lines += ["", "Every sample of every mode is in evidence.json."]
    return "\n".join(lines) + "\n"
