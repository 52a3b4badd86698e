"""The plots of a run, from its evidence alone, as SVG text (matplotlib, no pyplot state).

Every figure carries its provenance at the bottom (run id, kind, stack, versions,
registration). The SVG is byte-stable for the same evidence and matplotlib: no date, a
fixed id salt, text kept as text (searchable, crisp at any zoom, no font files needed).
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bsrctl.report.units import MIB, provenance

VERDICT_COLOUR = {"PASS": "#2e7d32", "FAIL": "#c62828", "UNKNOWN": "#f9a825", "": "#eeeeee"}
OUTCOME_COLOUR = {
    "pass": "#2e7d32",
    "exceeds": "#1565c0",  # the whole plan exceeds L1 by the law: an answer, not a failure
    "capacity": "#ef6c00",  # older evidence: not reused, before the law decided
    "fail": "#c62828",
    "unknown": "#9e9e9e",
    "memory_limit": "#212121",
}


@dataclass(frozen=True)
class Plot:
    name: str  # file stem: "peak-vs-tokens"
    title: str
    svg: str  # the <svg> element, no XML prolog


def new_fig(doc: dict[str, Any], title: str, panels: int = 1, width: float = 7.5) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 4.6 if panels == 1 else 4.9))
    axes = fig.subplots(1, panels, squeeze=False)[0]
    fig.suptitle(title, fontsize=11)
    note = "\n".join(textwrap.wrap(provenance(doc), 130))
    fig.text(0.01, 0.01, note, fontsize=6.5, color="#555555", va="bottom", ha="left")
    fig.subplots_adjust(bottom=0.22, top=0.86, wspace=0.3)
    return fig, list(axes)


def svg(fig: Any) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "bsrctl", "svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    # matplotlib's RDF block names the tool, no figure: drop it (the page names its run)
    start, end = text.find(" <metadata>"), text.find("</metadata>\n")
    if 0 <= start < end:
        text = text[:start] + text[end + len("</metadata>\n") :]
    return text


def _series(points: list[dict[str, Any]], key: str) -> dict[int, list[tuple[int, float]]]:
    """W -> [(tokens, measure)] of the points that measured it (repeat-salt points left out)."""
    out: dict[int, list[tuple[int, float]]] = {}
    for p in points:
        prm, val = p.get("params") or {}, (p.get("measures") or {}).get(key)
        if val is None or "salt" in prm or prm.get("window_chunks") is None:
            continue
        out.setdefault(prm["window_chunks"], []).append((prm["tokens"], val))
    return {w: sorted(v) for w, v in out.items()}


def _intervals(points: list[dict[str, Any]], key: str) -> dict[tuple[int, int], list[float]]:
    """(W, tokens) -> [lo, hi] of the measure's median, where the point has samples."""
    out = {}
    for p in points:
        prm, iv = p.get("params") or {}, (p.get("intervals") or {}).get(key)
        if iv and "salt" not in prm and prm.get("window_chunks") is not None:
            out[(prm["window_chunks"], prm["tokens"])] = iv
    return out


def sweep_plots(doc: dict[str, Any]) -> list[Plot]:
    pts = doc.get("points", [])
    reg = (doc.get("stack") or {}).get("registration") or {}
    out = []
    peaks = _series(pts, "restore_pool_peak_bytes")
    if peaks:
        fig, (ax,) = new_fig(doc, "Restore-pool peak vs prefix length")
        for w, xy in sorted(peaks.items(), reverse=True):
            label = f"W = {w} (BSR)" if w else "W = 0 (whole plan)"
            ax.plot([x for x, _ in xy], [y / MIB for _, y in xy], marker="o", label=label)
        c = reg.get("bytes_per_chunk")
        for w in (w for w in peaks if w and c):
            ax.axhline(w * c / MIB, ls="--", lw=1, color="#555555", label=f"W·c, W = {w}")
        ax.set(xlabel="prefix tokens N", ylabel="restore-pool peak (MiB)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
        out.append(Plot("peak-vs-tokens", "Restore-pool peak vs prefix length", svg(fig)))
    times = [("ttft_s", "TTFT"), ("restore_s", "restore time")]
    present = [(k, t) for k, t in times if _series(pts, k)]
    if present:
        title = " and ".join(t for _, t in present).capitalize() + " vs prefix length"
        fig, axes = new_fig(doc, title, panels=len(present))
        for ax, (key, label) in zip(axes, present, strict=True):
            bars = _intervals(pts, key)
            for w, xy in sorted(_series(pts, key).items(), reverse=True):
                xs, ys = [x for x, _ in xy], [y * 1000 for _, y in xy]
                ivs = [bars.get((w, x)) for x in xs]
                if all(iv is not None for iv in ivs):  # medians with their 95 % intervals
                    err = [[y - iv[0] * 1000 for y, iv in zip(ys, ivs, strict=True)],
                           [iv[1] * 1000 - y for y, iv in zip(ys, ivs, strict=True)]]  # fmt: skip
                    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"W = {w}")
                else:
                    ax.plot(xs, ys, marker="o", label=f"W = {w}")
            ax.set(xlabel="prefix tokens N", ylabel=f"{label} (ms)", title=label)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend()
        out.append(Plot("times-vs-tokens", title, svg(fig)))
    return out


def law_plots(doc: dict[str, Any]) -> list[Plot]:
    fit = (doc.get("summary") or {}).get("fit") or {}
    if not fit:
        return []
    ws, peaks = fit["windows_chunks"], fit["restore_pool_peak_bytes"]
    c = fit["bytes_per_chunk"]
    fig, (ax,) = new_fig(doc, "Capacity law: restore-pool peak vs W")
    ax.plot(ws, [p / MIB for p in peaks], "o", ms=7, label="measured peak")
    top = max(ws)
    slope, icpt = fit["slope_bytes_per_chunk"], fit["intercept_bytes"]
    ax.plot([0, top], [icpt / MIB, (icpt + slope * top) / MIB], "-", label=(
        f"least squares: {slope / MIB:.4f} MiB/chunk, R² {fit['r2']}"))  # fmt: skip
    ax.plot([0, top], [0, c * top / MIB], "--", color="#555555", label=f"c = {c / MIB:.4f} MiB")
    ax.set(xlabel="window W (chunks)", ylabel="restore-pool peak (MiB)")
    ax.grid(alpha=0.3)
    ax.legend()
    return [Plot("capacity-law", "Capacity law: restore-pool peak vs W", svg(fig))]


def ladder_plots(doc: dict[str, Any]) -> list[Plot]:
    pts = [p for p in doc.get("points", []) if not p.get("superseded_by")]
    if not pts:
        return []
    sizes = sorted({p["params"]["tokens"] for p in pts})
    rungs = sorted({p["params"]["l1_capacity_bytes"] for p in pts})
    fig, (ax,) = new_fig(doc, "Whole-plan ladder: L1 rungs passed and failed per prefix size")
    for outcome, colour in OUTCOME_COLOUR.items():
        xy = [
            (rungs.index(p["params"]["l1_capacity_bytes"]), sizes.index(p["params"]["tokens"]))
            for p in pts
            if p.get("rung_outcome") == outcome
        ]
        if xy:
            ax.scatter([x for x, _ in xy], [y for _, y in xy], s=300, marker="s", c=colour,
                       label=outcome.replace("_", " "))  # fmt: skip
    ax.set_xticks(range(len(rungs)), [f"{r / MIB:g} MiB" for r in rungs])
    ax.set_yticks(range(len(sizes)), [f"{s} tok" for s in sizes])
    ax.set(xlabel="L1 rung", ylabel="prefix size")
    ax.set_xlim(-0.7, len(rungs) - 0.3)
    ax.set_ylim(-0.7, len(sizes) - 0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.subplots_adjust(right=0.8)
    return [Plot("ladder", "Whole-plan ladder", svg(fig))]


def failmatrix_plots(doc: dict[str, Any]) -> list[Plot]:
    pts = doc.get("points", [])
    names = list(dict.fromkeys(c["name"] for p in pts for c in p["checks"]))
    if not pts or not names:
        return []
    from matplotlib.colors import ListedColormap

    order = ["", "PASS", "UNKNOWN", "FAIL"]
    grid = [
        [order.index({c["name"]: c["verdict"] for c in p["checks"]}.get(n, "")) for n in names]
        for p in pts
    ]
    height = max(4.6, 1.8 + 0.32 * len(pts))
    fig, (ax,) = new_fig(doc, "Failure matrix: cells × checks")
    fig.set_size_inches(7.5 + 0.25 * len(names), height)
    cmap = ListedColormap([VERDICT_COLOUR[v] for v in order])
    ax.imshow(grid, cmap=cmap, vmin=0, vmax=len(order) - 1, aspect="auto")
    ax.set_xticks(range(len(names)), [n.replace("_", " ") for n in names], rotation=35,
                  ha="right", fontsize=7)  # fmt: skip
    ax.set_yticks(range(len(pts)), [p["id"] for p in pts], fontsize=7)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if order[v]:
                ax.text(j, i, order[v][0], ha="center", va="center", fontsize=7, color="white")
    fig.subplots_adjust(left=0.25, bottom=0.3)
    return [Plot("failmatrix", "Failure matrix: cells × checks", svg(fig))]


def tempokv_plots(doc: dict[str, Any]) -> list[Plot]:
    summary = doc.get("summary") or {}
    cells = summary.get("cells") if summary.get("experiment") == "policies" else None
    if not cells:
        return []
    fig, axes = new_fig(doc, "TempoKV: staging cost C vs p95 TTFT, per policy", panels=len(cells),
                     width=max(7.5, 3.6 * len(cells)))  # fmt: skip
    for ax, cell in zip(axes, cells, strict=True):
        for policy, m in cell["policies"].items():
            ax.plot(m["c_gib_s_per_req"], m["p95_ttft_s"], "o", ms=7, label=policy)
            ax.annotate(policy, (m["c_gib_s_per_req"], m["p95_ttft_s"]), fontsize=6,
                        xytext=(4, 3), textcoords="offset points")  # fmt: skip
        ax.set_title(
            f"{cell['model']}, {cell['fast_tier_gib']:g} GiB, ratio {cell['cache_ratio']:g}",
            fontsize=8,
        )
        ax.set(xlabel="C (GiB·s / request)", ylabel="p95 TTFT (s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    return [Plot("tempokv-c-vs-p95", "TempoKV: C vs p95 TTFT per policy", svg(fig))]


PLOTS: dict[str, Callable[[dict[str, Any]], list[Plot]]] = {
    "sweep": sweep_plots,
    "law": law_plots,
    "ladder": ladder_plots,
    "failmatrix": failmatrix_plots,
    "tempokv": tempokv_plots,
}


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plots(doc: dict[str, Any]) -> list[Plot]:
    """Every plot of a run's kind (none for a kind without one, e.g. roundtrip)."""
    return PLOTS.get(doc["kind"], lambda _d: [])(doc)
