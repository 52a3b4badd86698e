"""Fault rules: what a fault adapter drops or delays, and the decision for one task.

A rule (all selectors present must match; a missing selector matches everything)::

    {"action": "drop" | "delay",
     "phase": "load" | "lookup",           # default "load"; lookup drops look like absence
     "delay_s": 5.0,                       # delay: result held until submit + delay_s
     "chunk_hashes": ["00ab.."],           # hex ObjectKey.chunk_hash
     "ranks": [1],                         # global rank, (kv_rank >> 16) & 0xff
     "kv_ranks": [16842754],               # raw ObjectKey.kv_rank
     "object_groups": [0], "models": ["m"],
     "positions": [0, 3],                  # index inside one task's key batch
     "tasks": [2],                         # ordinal of the phase's tasks since the rules
                                           # were armed: with BSR, window k = load task k
     "key_ordinals": [17],                 # ordinal of the phase's keys since armed
     "limit": 1}                           # at most this many keys (drop) / tasks (delay)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmcache.v1.distributed.api import ObjectKey

PHASES = ("load", "lookup")
ACTIONS = ("drop", "delay")
_LIST_SELECTORS = {
    "chunk_hashes": str,
    "ranks": int,
    "kv_ranks": int,
    "object_groups": int,
    "models": str,
    "positions": int,
    "tasks": int,
    "key_ordinals": int,
}
_RULE_FIELDS = {"action", "phase", "delay_s", "limit", *_LIST_SELECTORS}


@dataclass(frozen=True, slots=True)
class FaultRule:
    action: str  # "drop" | "delay"
    phase: str  # "load" | "lookup"
    delay_s: float  # delay: seconds after submission before the result is reported
    selectors: dict[str, frozenset]  # selector name -> accepted values; absent = any
    limit: int | None  # keys (drop) or tasks (delay) still affected; spent by replace()

    @classmethod
    def parse(cls, raw: Any, where: str = "rule") -> FaultRule:
        if not isinstance(raw, dict):
            raise ValueError(f"{where}: must be a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - _RULE_FIELDS)
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown}; known: {sorted(_RULE_FIELDS)}")
        action = raw.get("action")
        if action not in ACTIONS:
            raise ValueError(f"{where}.action: {action!r}, expected one of {list(ACTIONS)}")
        phase = raw.get("phase", "load")
        if phase not in PHASES:
            raise ValueError(f"{where}.phase: {phase!r}, expected one of {list(PHASES)}")
        delay_s = raw.get("delay_s", 0.0)
        if isinstance(delay_s, bool) or not isinstance(delay_s, int | float) or delay_s < 0:
            raise ValueError(f"{where}.delay_s: must be a number >= 0, got {delay_s!r}")
        if action == "delay" and delay_s <= 0:
            raise ValueError(f"{where}.delay_s: a delay rule needs delay_s > 0")
        limit = raw.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ValueError(f"{where}.limit: must be an integer, got {limit!r}")
        selectors: dict[str, frozenset] = {}
        for name, kind in _LIST_SELECTORS.items():
            if name not in raw:
                continue
            values = raw[name]
            if not isinstance(values, list) or any(
                isinstance(v, bool) or not isinstance(v, kind) for v in values
            ):
                raise ValueError(f"{where}.{name}: must be a list of {kind.__name__}")
            if name == "chunk_hashes":
                values = [v.lower() for v in values]
            selectors[name] = frozenset(values)
        return cls(action, phase, float(delay_s), selectors, limit)

    def matches(self, key: ObjectKey, position: int, task_ordinal: int, key_ordinal: int) -> bool:
        s = self.selectors
        checks = (
            ("chunk_hashes", lambda: key.chunk_hash.hex()),
            ("ranks", lambda: (key.kv_rank >> 16) & 0xFF),
            ("kv_ranks", lambda: key.kv_rank),
            ("object_groups", lambda: key.object_group_id),
            ("models", lambda: key.model_name),
            ("positions", lambda: position),
            ("tasks", lambda: task_ordinal),
            ("key_ordinals", lambda: key_ordinal),
        )
        return all(name not in s or value() in s[name] for name, value in checks)


def parse_rules(raw: Any) -> list[FaultRule]:
    if not isinstance(raw, list):
        raise ValueError(f"rules: must be a list, got {type(raw).__name__}")
    return [FaultRule.parse(r, f"rules[{i}]") for i, r in enumerate(raw)]


def rules_of_control_doc(doc: Any) -> list[FaultRule]:
    """A control file holds {"rules": [...]} (a bare list is accepted too)."""
    if isinstance(doc, dict):
        unknown = sorted(set(doc) - {"rules"})
        if unknown:
            raise ValueError(f"control file: unknown fields {unknown}; expected 'rules'")
        doc = doc.get("rules", [])
    return parse_rules(doc)


@dataclass(frozen=True)
class TaskFaults:
    """The faults decided for one task, and the rules left after it (limits spent)."""

    drops: frozenset[int]  # key positions reported missing
    delay_s: float  # result withheld until submission + delay_s (0 = none)
    rules: list[FaultRule]


def decide(
    rules: Sequence[FaultRule],
    phase: str,
    keys: Sequence[ObjectKey],
    task_ordinal: int,
    first_key_ordinal: int,
) -> TaskFaults:
    """Apply every rule of ``phase`` to one task's keys, in rule order."""
    left = list(rules)
    drops: set[int] = set()
    delay_s = 0.0
    for r, rule in enumerate(left):
        if rule.phase != phase:
            continue
        hit = [
            i
            for i, key in enumerate(keys)
            if rule.matches(key, i, task_ordinal, first_key_ordinal + i)
        ]
        if not hit or rule.limit is not None and rule.limit <= 0:
            continue
        if rule.action == "drop":
            if rule.limit is not None:
                hit = hit[: rule.limit]
                left[r] = replace(rule, limit=rule.limit - len(hit))
            drops.update(hit)
        else:
            if rule.limit is not None:
                left[r] = replace(rule, limit=rule.limit - 1)
            delay_s = max(delay_s, rule.delay_s)
    return TaskFaults(frozenset(drops), delay_s, left)
