"""What every tier of the bandwidth bench shares: one measured pass (``Sample``), the modes
measured round-robin (``Rounds``), a tier's result (``TierResult``) and its table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1 << 30
MIB = 1 << 20
L1_MARGIN = 64 * MIB  # L1 beyond what a restore stages (LMCache's own allocations)
READERS = (1, 2, 4, 8)  # raw FS readers
WHOLE = "whole-plan (W=0)"

Say = Callable[[str], None]


@dataclass(frozen=True)
class Sample:
    """One pass of one mode: seconds and bytes; a restore also its staging peaks, the time to
    its first installed window and its per-window phases; the FS concurrency sweep also the
    adapter's read counters."""

    s: float
    bytes: int
    peak: int | None = None  # measured L1 staging peak, max over ranks
    gauge_peak: int | None = None  # the core's own accounting, max over ranks
    first_s: float | None = None  # retrieve start -> first window installed
    windows: tuple[dict[str, float], ...] = field(default=(), compare=False)
    read_ns: int | None = None  # adapter time spent reading, all ranks
    read_bytes: int | None = None  # adapter bytes read, all ranks
    peak_inflight: int | None = None  # most reads in flight on one rank

    @property
    def rate(self) -> float:
        return self.bytes / self.s


@dataclass(frozen=True)
class Row:
    """A mode's median pass, as a tier's result keeps it."""

    label: str
    s: float
    bytes: int
    peak: int | None = None
    gauge_peak: int | None = None
    first_s: float | None = None
    read_ns: int | None = None
    read_bytes: int | None = None
    peak_inflight: int | None = None

    @classmethod
    def of(cls, label: str, m: Sample) -> Row:
        doc = {k: v for k, v in asdict(m).items() if k != "windows"}
        return cls(label=label, **doc)

    @property
    def rate(self) -> float:
        return self.bytes / self.s


@dataclass(frozen=True)
class Lookup:
    """Median seconds of the probe-only lookup of the whole prefix and of the stock
    lookup-and-lock of the same keys."""

    probe_s: float
    stock_s: float


@dataclass(frozen=True)
class TierResult:
    """One tier at one size: every mode's median row, the best baseline, the lookup."""

    tokens: int
    rows: tuple[Row, ...]
    best_raw: float  # bytes/s of the best baseline (raw readers or store client)
    best_raw_label: str
    lookup: Lookup
    # every round's pass of each mode, in measurement order: label -> measure -> values
    # (pass_s, first_window_s, peak_bytes): the evidence's samples
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def rate(self) -> dict[str, float]:
        return {r.label: r.rate for r in self.rows}

    @property
    def whole(self) -> float | None:
        return self.rate.get(WHOLE)

    def row(self, label: str) -> Row:
        return next(r for r in self.rows if r.label == label)

    @classmethod
    def of(
        cls,
        tokens: int,
        rows: list[Row],
        baseline: str,
        lookup: Lookup,
        rounds: Rounds | None = None,
    ) -> TierResult:
        """The best baseline is the fastest row whose label starts with ``baseline``; the
        samples are ``rounds``' passes."""
        best = max((r.rate, r.label) for r in rows if r.label.startswith(baseline))
        samples = rounds.samples() if rounds is not None else {}
        return cls(tokens, tuple(rows), best[0], best[1], lookup, samples)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TierResult:
        return cls(
            tokens=doc["tokens"],
            rows=tuple(Row(**r) for r in doc["rows"]),
            best_raw=doc["best_raw"],
            best_raw_label=doc["best_raw_label"],
            lookup=Lookup(**doc["lookup"]),
            samples=doc.get("samples", {}),
        )


class ModeFailed(RuntimeError):
    """A mode's tool failed (fio's exit and message): the mode is dropped, the bench goes on."""


class Rounds:
    """Modes measured round-robin: every round runs each mode once, in order."""

    def __init__(self) -> None:
        self.modes: list[tuple[str, Callable[[], Sample]]] = []
        self.runs: dict[str, list[Sample]] = {}

    def add(self, label: str, fn: Callable[[], Sample]) -> None:
        self.modes.append((label, fn))
        self.runs[label] = []

    def order(self, r: int, repeat: int) -> list[str]:
        """Round r starts at mode r*k/repeat (cyclic): the shared disk's speed drifts
        (measured: the same restore read 1.1 to 2.2 GiB/s from one pass to the next), so
        no mode always runs early or late in a round."""
        k = len(self.modes)
        at = (r * k // repeat) % k  # spread the starts over the whole round
        labels = [label for label, _fn in self.modes]
        return labels[at:] + labels[:at]

    def run(self, repeat: int, say: Callable[[str], None] = print) -> None:
        """Every round; a mode that raises ``ModeFailed`` is dropped from the bench with
        one line saying why (its earlier rounds too: its samples would not pair)."""
        fns = dict(self.modes)
        for r in range(repeat):
            for label in self.order(r, repeat):
                if label not in fns:
                    continue
                try:
                    self.runs[label].append(fns[label]())
                except ModeFailed as e:
                    say(f"# {label}: dropped in round {r + 1} ({e})")
                    del fns[label], self.runs[label]
                    self.modes = [(k, fn) for k, fn in self.modes if k != label]

    def samples(self) -> dict[str, dict[str, list[float]]]:
        """Every pass of each mode in measurement order: seconds, and where measured the
        time to the first installed window and the staging peak."""
        out: dict[str, dict[str, list[float]]] = {}
        for label, runs in self.runs.items():
            doc = {"pass_s": [r.s for r in runs]}
            for name, key in (("first_window_s", "first_s"), ("peak_bytes", "peak")):
                vals = [getattr(r, key) for r in runs]
                if vals and all(v is not None for v in vals):
                    doc[name] = [float(v) for v in vals]
            out[label] = doc
        return out

    def median(self, label: str) -> Sample:
        """The run of median seconds (its other fields kept together)."""
        runs = sorted(self.runs[label], key=lambda r: r.s)
        return runs[(len(runs) - 1) // 2]


def phase_means(windows: tuple[dict[str, float], ...]) -> str:
    """Mean per window of fetch, wait, install, sync (ms), and the admission wait."""
    if not windows:
        return ""
    n = len(windows)

    def mean(k: str) -> float:
        return 1000 * sum(w[k] for w in windows) / n

    return (
        f"per window (n={n}) fetch {mean('fetch_s'):.1f} wait {mean('wait_s'):.1f} "
        f"install {mean('install_s'):.2f} sync {mean('sync_s'):.2f} "
        f"admit {mean('admit_wait_s'):.2f} ms"
    )


def table(say: Say, rounds: Rounds) -> list[Row]:
    """Print every mode's median pass (and each pass's rate), its per-window phases and the
    adapter's reads when measured; return the median rows in mode order."""
    say(f"{'mode':52} {'s':>7} {'GiB/s':>6} {'first ms':>8} {'peak B/rank':>11}  runs GiB/s")
    rows = []
    for label, _fn in rounds.modes:
        m = rounds.median(label)
        rates = " ".join(f"{r.rate / GIB:.2f}" for r in rounds.runs[label])
        first = f"{1000 * m.first_s:8.1f}" if m.first_s is not None else f"{'':8}"
        peak = f"{m.peak:11d}" if m.peak is not None else f"{'':11}"
        say(f"{label:52} {m.s:7.3f} {m.rate / GIB:6.2f} {first} {peak}  [{rates}]")
        rows.append(Row.of(label, m))
        if m.windows:
            say(f"{'':4}{phase_means(m.windows)}")
        if m.read_ns and m.read_bytes is not None:
            svc = m.read_bytes / (m.read_ns / 1e9) / GIB
            say(
                f"{'':4}adapter reads: {svc:.2f} GiB/s per read in flight, "
                f"{m.read_ns / 1e9 / m.s:.2f} reads in flight on average "
                f"(peak {m.peak_inflight} per rank)"
            )
    return rows
