"""Units people read (MiB, ms, tokens) and the provenance line every table and figure
carries: run id, kind, stack, versions, registration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bsrctl.report.registration import lines as registration_lines

MIB = 1 << 20


def mib(n: float | None, digits: int = 2) -> str:
    """Bytes shown in MiB ("1.50 MiB"); "" for None."""
    return "" if n is None else f"{n / MIB:.{digits}f} MiB"


def ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1000:.1f} ms"


def ms_ci(point: dict[str, Any], key: str) -> str:
    """A point's timed measure in ms: the median and its 95 % interval where the point has
    samples ("12.1 ms [11.4, 13.0]"), else its one value."""
    value = (point.get("measures") or {}).get(key)
    iv = (point.get("intervals") or {}).get(key)
    if value is None or not iv:
        return ms(value)
    return f"{value * 1000:.1f} ms [{iv[0] * 1000:.1f}, {iv[1] * 1000:.1f}]"


def size(n: int) -> str:
    """A rung or an L1: 2 GiB, 4 MiB, 512 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def span(values: Iterable[float], fmt: Any) -> str:
    """ "a" when all equal, else "a–b" (min–max)."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return ""
    lo, hi = fmt(vals[0]), fmt(vals[-1])
    return lo if lo == hi else f"{lo} – {hi}"


def registration_line(reg: dict[str, Any]) -> str:
    """tiny-llama-cpu: c = 0.25 MiB per 256-token chunk per rank, TP 1, digest 6ae89fcf0b93."""
    if not reg:
        return "no registration (no KV state)"
    return (
        f"{reg.get('model', '?')}: c = {mib(reg.get('bytes_per_chunk'))} per "
        f"{reg.get('chunk_tokens', '?')}-token chunk per rank, TP {reg.get('tp_size', '?')}, "
        f"aux {reg.get('aux_bytes', 0)} B, digest {str(reg.get('digest', ''))[:12]}"
    )


def versions_line(stack: dict[str, Any]) -> str:
    versions = stack.get("versions") or {}
    shown = {k: (v[:12] if k.endswith("sha256") else v) for k, v in versions.items()}
    return ", ".join(f"{k} {v}" for k, v in shown.items()) or "versions not recorded"


def provenance(doc: dict[str, Any]) -> str:
    """One line naming where a figure or table comes from."""
    stack = doc.get("stack") or {}
    return (
        f"{doc['run_id']} · {doc['kind']} · {stack.get('kind', '?')} stack · "
        f"{versions_line(stack)} · {registration_line(stack.get('registration') or {})}"
    )


def header(doc: dict[str, Any], title: str | None = None) -> list[str]:
    """The lines every restore summary starts with."""
    stack = doc.get("stack") or {}
    lines = [
        f"# {doc['run_id']} ({title or doc['kind']}): {doc['verdict']}",
        "",
        f"- complete: {doc['complete']}; started {doc['started_at']}; finished "
        f"{doc.get('finished_at')}",
        f"- stack: {stack.get('kind')} ({versions_line(stack)}); salt `{doc['salt']}`; spec "
        f"sha256 `{doc['spec_sha256'][:12]}`",
        f"- registration: {registration_line(stack.get('registration') or {})}",
    ]
    lines += registration_lines(doc)
    aborted = (doc.get("summary") or {}).get("aborted")
    if aborted:
        lines.append(f"- aborted: {aborted} (points so far: {doc.get('points_verdict', '?')})")
    return lines


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table without the columns no row fills."""
    keep = [i for i in range(len(head)) if i < 2 or any(r[i] for r in rows)]
    out = ["| " + " | ".join(head[i] for i in keep) + " |", "|" + "---|" * len(keep)]
    out += ["| " + " | ".join(r[i] for i in keep) + " |" for r in rows]
    return out


def guard_lines(points: Iterable[dict[str, Any]]) -> list[str]:
    """ "## Extension guards": each distinct ``extensions_healthy`` outcome that did not PASS,
    with the points it holds for (a soak round's requests share theirs); nothing when every
    point's passed. For reports whose point checks have no table of their own."""
    by: dict[tuple[str, str], list[str]] = {}
    for p in points:
        for c in p.get("checks", []):
            if c["name"] == "extensions_healthy" and c["verdict"] != "PASS":
                by.setdefault((c["verdict"], c["detail"]), []).append(str(p["id"]))
    if not by:
        return []
    lines = ["", "## Extension guards", ""]
    for (verdict, detail), ids in by.items():
        lines.append(f"- {verdict} ({', '.join(ids)}): {detail}")
    return lines
