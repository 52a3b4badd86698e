"""summary.md of a soak run (kind ``soak``), from its evidence alone: the soak's last line,
every violation with its request and fault, the schedule as it was placed, the requests by
prefix, what was left after the quiesce."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bsrctl.report.units import guard_lines, header, table


def render(doc: dict[str, Any]) -> str:
    s = doc.get("summary") or {}
    lines = header(doc, "soak")
    lines += [
        "",
        f"Seed {s.get('seed')}, {s.get('duration_s')} s: {s.get('line', 'not finished')}.",
    ]
    if s.get("aborted"):
        lines.append(f"- aborted: {s['aborted']}")
    violations = s.get("violations") or []
    if violations:
        lines += ["", "## Violations", ""]
        lines += [
            f"- {v['kind']}: {v['detail']} (request {v['request']}, fault {v['fault']})"
            for v in violations
        ]
    armed = s.get("armed") or []
    if armed:
        lines += ["", "## Faults (as scheduled, and as placed)", ""]
        rows = [
            [str(a["index"]), a["fault"], str(a["window"]), str(a["prefix"]), f"{a['start_s']:g}",
             f"{a['armed_at_s']:g}", str(a["round"]), "yes" if a["placed"] else f"no: {a['error']}"]
            for a in armed
        ]  # fmt: skip
        head = ["#", "cell", "window", "prefix", "due_s", "armed_s", "round", "placed"]
        lines += table(head, rows)
    points = doc.get("points", [])
    if points:
        by = Counter((p["params"]["prefix_tokens"], p["verdict"]) for p in points)
        lines += ["", "## Requests by prefix", ""]
        rows = [[str(n), v, str(k)] for (n, v), k in sorted(by.items())]
        lines += table(["prefix_tokens", "verdict", "requests"], rows)
        lines += guard_lines(points)
    if s.get("quiesced") is not None:
        q = s["quiesced"]
        lines += ["", f"After the quiesce: {q}; pool peak {s.get('pool_peak_max_bytes')} B, "
                      f"bound {s.get('pool_bound_bytes')} B."]  # fmt: skip
    checks = s.get("checks", [])
    if checks:
        lines += ["", "## Run checks", ""]
        lines += [f"- {c['name']}: {c['verdict']}: {c.get('detail', '')}" for c in checks]
    return "\n".join(lines) + "\n"
