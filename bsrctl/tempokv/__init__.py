"""TempoKV: time SSD→fast-tier staging commitment by time-to-use vs time-to-ready.

Engine-independent: the same claims, estimators, controller and provider run against the
simulated engine and device (`sim/`) and the real serving stack (`--stack serving`).
"""

from bsrctl.clock import Clock, VirtualClock, WallClock
from bsrctl.tempokv.claims import Claim, ClaimState, Transition
from bsrctl.tempokv.controller import Controller, RetrievalGrant
from bsrctl.tempokv.kv import GIB, KvObject, Manifest
from bsrctl.tempokv.policies import POLICY_NAMES, Policy, make_policy
from bsrctl.tempokv.provider import CommitRefusal, StagingProvider

__all__ = [
    "GIB",
    "POLICY_NAMES",
    "Claim",
    "ClaimState",
    "Clock",
    "CommitRefusal",
    "Controller",
    "KvObject",
    "Manifest",
    "Policy",
    "RetrievalGrant",
    "StagingProvider",
    "Transition",
    "VirtualClock",
    "WallClock",
    "make_policy",
]
