"""The contract between experiments and whatever runs a restore: a Target, and the typed
measures of one restore point.

    target.prepare(prompts)                        # canonical outputs (serving), disk (storage)
    target.deploy(l1_bytes, settings)              # a fresh deployment with this L1, W and B
    target.store(prompts)                          # seed prefixes for later deployments
    measures = target.measure(prompt, window_chunks, cold)   # seed, forget, restore, health
    target.teardown(); target.cleanup()

Made once per run from ``stack.kind`` by ``bsrctl.stack.selector.make_target``.

Every target returns one ``RestoreMeasures`` per point, of its own type (``measures``:
``ServingMeasures`` or ``StorageMeasures``); acceptance reads its attributes, evidence stores
``to_json()`` and re-judging a point reads it back with ``measures_from_json``.
A stack failure raises StackFailed; the experiment decides what that means for its run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from bsrctl.stack.contracts.measures import RestoreMeasures
from bsrkv.registration import Registration
from bsrkv.settings import RestoreSettings


class Prompt(NamedTuple):
    """A deterministic prompt: token ids drawn from (salt, tokens)."""

    salt: str
    tokens: int


class Target(Protocol):
    """What ladder, sweep and law drive: a serving deployment (launched or attached) or the
    storage stack. One instance per run, made by ``bsrctl.stack.selector.make_target``."""

    kind: str  # the run's stack.kind: "serving" | "attach" | "storage"
    reg: Registration  # the geometry restored: c and the digest are checked against it
    on_phase: Callable[[str], None]  # told each step of a point (seed, forget, restore, ...)

    def prepare(self, prompts: list[Prompt]) -> None:
        """Before any deployment: canonical outputs, disk room; BadInput when impossible."""

    def fits(self, l1_bytes: int) -> tuple[bool, str]:
        """Whether an L1 of this size fits the machine, and the numbers behind the answer."""

    def l1_bytes(self, asked: int) -> int:
        """The L1 a deployment asked for `asked` bytes runs with (attached: the operator's,
        known once ``prepare`` connected); what the console shows."""

    def deploy(self, l1_bytes: int, settings: RestoreSettings) -> None:
        """A fresh deployment with this L1 and these restore settings."""

    def describe(self) -> dict[str, Any]:
        """The evidence's `stack` block: kind, versions, registration, endpoints."""

    def store(self, prompts: list[Prompt]) -> None:
        """Seed every prompt's prefix into the L2 tier (later deployments restore it)."""

    def measure(
        self, prompt: Prompt, window_chunks: int, cold: bool = True, oracle: bool = True
    ) -> RestoreMeasures:
        """One restore point: seed (when cold), forget locally, restore with W, check health.
        ``oracle``: the accuracy pass (serving: the install read-back; storage: every
        installed byte compared); off, the timed production path."""

    def forget_salt_files(self) -> None:
        """Bound disk before a new salt: drop the L2 files of the prompts measured so far
        (the storage stack's own files; a serving deployment's L2 is its own: nothing)."""

    def teardown(self) -> None:
        """Let this deployment go (launched: every process by PID; attached: the operator's
        settings given back); the run's files stay."""

    def cleanup(self) -> None:
        """After the run: teardown, and remove what the run no longer needs."""
