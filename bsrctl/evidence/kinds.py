"""The kinds of evidence: the one registry that the writer (``record``), the schema
(``schema.KindName``) and the report (``bsrctl.report.kinds``) derive theirs from, so a new
kind is added here once instead of in three lists that drift apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

KindName = Literal["ladder", "sweep", "law", "failmatrix", "tempokv", "roundtrip", "bench", "soak"]


@dataclass(frozen=True)
class Kind:
    """What a kind of run needs beyond its name."""

    # the module whose render(doc) writes its summary.md: a name under bsrctl.report, or a
    # full module path for a mechanism's report kept beside it (bsrctl.tempokv.report)
    renderer: str
    run_prefix: str | None = None  # br-<prefix>-<hex>: the paper names its sweep runs e1


KINDS: dict[KindName, Kind] = {
    "ladder": Kind("restore"),
    "sweep": Kind("restore", run_prefix="e1"),
    "law": Kind("restore"),
    "failmatrix": Kind("failmatrix"),
    "tempokv": Kind("bsrctl.tempokv.report"),
    "roundtrip": Kind("restore"),
    "bench": Kind("bench"),
    "soak": Kind("soak"),
}
# The Literal is what the schema's model and a type checker read; tests/bsrctl/evidence checks
# that the table lists the same kinds in the same order.
NAMES: tuple[KindName, ...] = get_args(KindName)
