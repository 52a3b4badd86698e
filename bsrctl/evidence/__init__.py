"""Evidence: the record of a run. Every report is rendered from evidence.json."""

from bsrctl.evidence.record import EvidenceWriter, load_evidence, new_run_id
from bsrctl.evidence.verdict import Check, Point, Verdict, exit_code, merge

__all__ = [
    "Check",
    "EvidenceWriter",
    "Point",
    "Verdict",
    "exit_code",
    "load_evidence",
    "merge",
    "new_run_id",
]
