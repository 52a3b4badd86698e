"""The deployment the serving cells share, and what a cell reads off it.

One serving ``Deployment`` (``bsrctl.stack.contracts.deployment``: launched by PID, or the
operator's when ``stack.kind: attach``; every fault here is recoverable: what was stopped is
restarted, rules are cleared) with the canonical outputs of every cell's prompt; seeding (the
stack's one loop, ``bsrctl.stack.measure.seeding``), the snapshots taken around a cell's
request, the follow-up request and the process audit. The cell run itself is ``failmatrix.serving``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.experiments.failmatrix.injectors import Injector, clear_rules
from bsrctl.experiments.failmatrix.spec import CellSpec, FailMatrixSpec
from bsrctl.prompts import prompt_ids
from bsrctl.stack.contracts.bsr_client import BsrModuleClient, outcomes_since
from bsrctl.stack.contracts.deployment import Deployment, OnDeployment
from bsrctl.stack.launch.extensions import ServerModule
from bsrctl.stack.launch.model import prepare_model
from bsrctl.stack.measure.canonical_outputs import canonical_outputs
from bsrctl.stack.measure.seeding import seed_tiers
from bsrctl.stack.measure.tiers import chunk_hashes_hex, fault_stats, fs_objects
from bsrctl.stack.selector import make_deployment

Say = Callable[[str], None]
RECOVERED = "Recovered from KV load failure"
HEALTH_TOKENS = 320
FORGET_WAIT_S = 3.0  # per L1 forget of a cell (the server itself waits a few seconds)
CLIENT_TIMEOUT_S = 30.0  # one bsr.* call of a cell (a fault may hold the server)


class Rig(OnDeployment):
    """One serving deployment shared by the cells: lifecycle, seeding and probes.

    ``deployment``: the one to run the cells on (default: ``make_deployment`` of the spec's
    ``stack.kind`` with the matrix's settings and ``server_module``)."""

    def __init__(
        self,
        spec: FailMatrixSpec,
        run_dir: Path,
        say: Say,
        server_module: ServerModule | None = None,
        deployment: Deployment | None = None,
    ) -> None:
        self.spec = spec
        self.say = say
        self.run_dir = run_dir
        self.deployment: Deployment = deployment or make_deployment(
            spec.stack, run_dir, spec.settings(), server_module, CLIENT_TIMEOUT_S
        )
        self.canonical: dict[str, tuple[int, ...]] = {}
        self.vocab = 0

    @property
    def attached(self) -> bool:
        """The operator's deployment: bsrctl kills or restarts nothing of it by itself."""
        return self.deployment.kind == "attach"

    # -- lifecycle --

    def prepare(self, cells: list[CellSpec]) -> None:
        """Canonical outputs of every cell's prompt, then the deployment up with the
        matrix's W, B and timeouts (attached: set over bsr.configure, given back at close)."""
        wl = self.spec.workload
        self.vocab = prepare_model(self.spec.stack.vllm).vocab
        prompts = {n: ids for c in cells for n, ids in self.cell_prompts(c).items()}
        prompts["__health__"] = self.prompt("__health__", HEALTH_TOKENS)
        self.say("canonical outputs on a vLLM with no KV connector")
        outs = canonical_outputs(
            self.spec.stack, self.run_dir, list(prompts.values()), wl.max_tokens
        )
        self.canonical = dict(zip(prompts, outs, strict=True))
        self.say(
            "attaching to the operator's deployment"
            if self.attached
            else "starting the serving stack"
        )
        self.deployment.up(self.spec.settings())

    def close(self) -> None:
        self.deployment.down()

    def prompt(self, name: str, tokens: int | None = None) -> list[int]:
        wl = self.spec.workload
        return prompt_ids(f"{wl.salt}/{name}", tokens or wl.prompt_tokens, self.vocab)

    def cell_prompts(self, cell: CellSpec) -> dict[str, list[int]]:
        """The cell's prompts by name: its own (its prefix tokens), or concurrent_restores'
        one per request, of the sizes its mix cycles through."""
        if cell.fault == "concurrent_restores":
            return {f"{cell.id}/r{i}": self.prompt(f"{cell.id}/r{i}", n)
                    for i, n in enumerate(cell.mix())}  # fmt: skip
        return {cell.id: self.prompt(cell.id, cell.tokens(self.spec.workload.prompt_tokens))}

    def reconnect(self) -> BsrModuleClient:
        """A new bsr.* client after LMCache restarted (attached: the matrix's settings again)."""
        self._client = None
        return self.deployment.reconnect()

    def ensure_up(self) -> None:
        """Restart a part a previous cell left down (bounded by the stack's own waits); an
        attached deployment is the operator's: a part down there is a StackFailed."""
        self.deployment.ensure_up(self.say)

    # -- seeding --

    def seed(self, ids: list[int], tiers: tuple[str, ...]) -> dict[str, Any]:
        """Store the prompt's prefix and VERIFY that every tier in `tiers` holds all of it,
        then make L1 and vLLM forget it. `complete` False (with the reason) if a tier still
        misses chunks after the seeding's bounded cold requests.

        L1 is emptied first: LMCache allocates L1 without evicting (its eviction loop runs
        once a second above an 80% watermark), so a store into an L1 a previous cell left
        full loses whole batches, which then never reach L2."""
        assert self.client is not None
        t0 = time.monotonic()
        clear_rules(self.stack)  # no rule left armed by an earlier cell
        s = seed_tiers(
            self.stack,
            self.client,
            ids,
            chunk_tokens=self.spec.stack.lmcache.chunk_size,
            tiers=tiers,
            max_tokens=self.spec.workload.max_tokens,
            forget_first=True,
            forget_wait_s=FORGET_WAIT_S,
        )
        forgot = self.client.forget(wait_s=FORGET_WAIT_S)
        self.stack.forget_local()
        short = s.short
        return {
            "complete": not short,
            "reason": ""
            if not short
            else f"setup: after {len(s.attempts)} seeding attempt(s) tier(s) hold "
            + ", ".join(f"{t} {c}/{s.chunks} chunks" for t, c in short.items())
            + " of the seeded prefix: the fault was not injected",
            "tiers": list(tiers),
            "chunks": s.chunks,
            "held_chunks": {"fs": 0, "mooncake": 0, **s.held},
            "attempts": [
                {
                    "l1_used_before": a.l1_used_before,
                    "cached_tokens": a.cached_tokens,
                    **{"fs": 0, "mooncake": 0, **a.held},
                    "hidden": list(a.hidden),
                }
                for a in s.attempts
            ],
            "seed_s": round(time.monotonic() - t0, 3),
            "l1_used_after_forget": forgot.l1_used_bytes_after,
        }

    # -- probes around a cell's request --

    def fs_prefix_tokens(self, ids: list[int]) -> int:
        """Tokens of the contiguous prefix the FS L2 holds now (capped like vLLM's hit)."""
        lm = self.spec.stack.lmcache
        if not lm.fs_l2:
            return 0
        n = 0
        for h in chunk_hashes_hex(ids, lm.chunk_size, len(ids) // lm.chunk_size):
            if not fs_objects(self.stack, h):
                break
            n += 1
        return min(n * lm.chunk_size, len(ids) - 1)

    def snapshot(self) -> dict[str, Any]:
        assert self.client is not None
        out: dict[str, Any] = {"recovered": self._recovered()}
        try:
            status = self.client.status()
            out["counters"] = status.counters
            out["outcomes"] = list(status.recent_outcomes)
            out["markers"] = [e.to_json() for e in self.client.markers().events]
            out["reads"] = self.stack.tier_reads()
            out["fs"] = fault_stats(self.stack, "fs").get("inner", {})
        except (StackFailed, OSError) as exc:
            out.update(counters={}, outcomes=[], markers=[], reads={}, fs={}, error=str(exc))
        return out

    @staticmethod
    def new_outcomes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
        """The restore outcomes of the cell's request, between two snapshots, as the evidence
        records them (the server's JSON)."""
        return [o.to_json() for o in outcomes_since(before["outcomes"], after["outcomes"])]

    def _recovered(self) -> int | None:
        """vLLM's KV-load recoveries so far (its log); None when there is no log to read."""
        log = self.deployment.vllm_log()
        if log is None:
            return None
        try:
            return Path(log).read_text(errors="replace").count(RECOVERED)
        except OSError:
            return None

    def markers_active(self) -> int | None:
        try:
            assert self.client is not None
            return int(self.client.call("bsr.markers").get("active", -1))
        except (StackFailed, OSError):
            return None

    @staticmethod
    def damage(
        cell: CellSpec, inj: Injector, before: dict[str, Any], after: dict[str, Any]
    ) -> dict[str, Any]:
        if not cell.fault.startswith("object_"):
            return {}
        counter = "checksum_mismatch" if cell.fault == "object_corrupted" else "size_mismatch"
        moved = int(after["fs"].get(counter, 0)) - int(before["fs"].get(counter, 0))
        return {"counter": counter, "counter_delta": moved, "window": cell.window,
                **inj.notes.get("object", {})}  # fmt: skip

    # -- after the request --

    def follow_up(self) -> tuple[bool, str]:
        """The post-request health check (``bsrctl.stack.contracts.deployment``): the health prompt
        answers with its canonical output and every part is healthy."""
        f = self.deployment.follow_up(
            self.prompt("__health__", HEALTH_TOKENS),
            self.spec.workload.max_tokens,
            self.canonical["__health__"],
        )
        return f.ok, f.detail

    def audit(self, stopped: list[int]) -> tuple[list[int], dict]:
        """Stopped and replaced PIDs are gone; every current part is alive (attached: every
        part answers; bsrctl holds none of their PIDs)."""
        return self.deployment.audit(stopped)
