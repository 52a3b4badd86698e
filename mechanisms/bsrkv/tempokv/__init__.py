"""TempoKV: time SSD→fast-tier staging commitment by time-to-use vs time-to-ready.

Engine-independent: the same claims, estimators, controller and provider run against the
simulated engine and device of a harness and inside the serving stack
(``bsrkv.lmcache_ext``, ``bsrkv.vllm_ext``).
"""

from bsrkv.clock import Clock, VirtualClock, WallClock
from bsrkv.tempokv.claims import Claim, ClaimState, Transition
from bsrkv.tempokv.controller import Controller, RetrievalGrant
from bsrkv.tempokv.kv import GIB, KvObject, Manifest
from bsrkv.tempokv.policies import POLICY_NAMES, Policy, make_policy
from bsrkv.tempokv.provider import CommitRefusal, StagingProvider

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
