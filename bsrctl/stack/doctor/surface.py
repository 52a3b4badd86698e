"""`bsrctl doctor`'s surface rows: the vLLM and LMCache names bsrkv and bsrctl declare
(``bsrkv.hostsurface``), each missing one named with who reads it, and the known-broken
vLLM/LMCache pairs with their cause. The version pins are what bsrctl is tested with; these
rows decide whether another release runs.
"""

from __future__ import annotations

from bsrctl.stack.doctor.checks import Finding
from bsrkv.hostsurface.check import Report, broken_pairs
from bsrkv.hostsurface.declared import CONNECTOR, TESTED_WITH

LABEL = {"vllm": "vLLM", "lmcache": "LMCache"}


def surface_findings(reports: tuple[Report, ...]) -> list[Finding]:
    """One row per package whose surface is complete, one per missing name, one per
    known-broken pair."""
    rows: list[Finding] = []
    versions: dict[str, str | None] = {}
    for r in reports:
        label = f"{LABEL[r.package]} surface"
        versions[r.package] = r.version
        got = f"{r.package} {r.version or '?'} at {r.root}"
        if r.absent:
            value = f"no {r.package} at {r.root}: its {len(r.rows)} declared names unchecked"
            rows.append(Finding(label, False, value, f"install {r.package} (or `make venv`)"))
            continue
        if not r.missing:
            flags = sum(1 for row in r.rows if row.name.is_flag)
            value = f"complete: {len(r.rows) - flags} names, {flags} flags in {got}"
            rows.append(Finding(label, True, value))
            continue
        tested = TESTED_WITH[r.package]
        for row in r.missing:
            who = row.name.user
            fix = f"use {r.package} {tested} (tested with), or port {who} to {r.version}"
            if who == CONNECTOR:
                who += " (LMCache's MP connector)"
                fix = f"use {r.package} {tested} (tested with), or an LMCache built for it"
            value = f"{row.name} missing in {got}: {row.why}; read by {who}"
            rows.append(Finding(label, False, value, fix))
    for pair in broken_pairs(versions.get("vllm"), versions.get("lmcache")):
        value = f"vLLM {versions['vllm']} with LMCache {versions['lmcache']}: {pair.cause}"
        fix = (
            f"use vLLM below {pair.vllm_from} (tested with {TESTED_WITH['vllm']}) with "
            f"LMCache {pair.lmcache}, or an LMCache release built for vLLM {pair.vllm_from}"
        )
        rows.append(Finding("known-broken pair", False, value, fix))
    return rows
