"""The deployment the serving cells share, and what a cell reads off it.

One serving stack (every fault here is recoverable: what was stopped is restarted, rules are
cleared) with the canonical outputs of every cell's prompt; seeding (the stack's one loop,
``bsrctl.stack.seeding``), the snapshots taken around a cell's request, the follow-up
request and the process audit. The cell run itself is ``failmatrix.serving``.
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
from bsrctl.stack import tinymodel
from bsrctl.stack.attach import AttachedStack
from bsrctl.stack.bsr_client import BsrModuleClient, outcomes_since
from bsrctl.stack.canonical import canonical_outputs
from bsrctl.stack.extensions import ServerModule, bsr_extensions
from bsrctl.stack.process import pids_alive
from bsrctl.stack.seeding import seed_tiers
from bsrctl.stack.serving import ServingStack
from bsrctl.stack.tiers import chunk_hashes_hex, fault_stats, fs_objects

Say = Callable[[str], None]
RECOVERED = "Recovered from KV load failure"
HEALTH_TOKENS = 320
TIMEOUTS = ("window_timeout_s", "probe_timeout_s", "admission_timeout_s", "retrieve_deadline_s",
            "drain_timeout_s", "stall_guard_s")  # fmt: skip
FORGET_WAIT_S = 3.0  # per L1 forget of a cell (the server itself waits a few seconds)


class Rig:
    """One serving deployment shared by the cells: lifecycle, seeding and probes."""

    def __init__(
        self,
        spec: FailMatrixSpec,
        run_dir: Path,
        say: Say,
        server_module: ServerModule | None = None,
    ) -> None:
        self.spec = spec
        self.say = say
        self.run_dir = run_dir
        ext = (
            bsr_extensions(spec.settings())
            if server_module is None
            else bsr_extensions(
                spec.settings(),
                server_module.module_path,
                server_module.config,
                server_module.pythonpath,
            )
        )
        self.attached = spec.stack.kind == "attach"
        self.stack: Any = (
            AttachedStack(spec.stack, run_dir)
            if self.attached
            else ServingStack(spec.stack, run_dir, ext)
        )
        self.operator_config: dict[str, Any] = {}  # attach: the module's config to give back
        self.client: BsrModuleClient | None = None
        self.canonical: dict[str, tuple[int, ...]] = {}
        self.vocab = 0

    # -- lifecycle --

    def prepare(self, cells: list[CellSpec]) -> None:
        wl = self.spec.workload
        model = tinymodel.build() if self.spec.stack.vllm.model == "tiny" else None
        self.vocab = tinymodel.vocab_size(model or Path(self.spec.stack.vllm.model))
        prompts = {c.id: self.prompt(c.id) for c in cells}
        prompts["__health__"] = self.prompt("__health__", HEALTH_TOKENS)
        self.say("canonical outputs on a vLLM with no KV connector")
        outs = canonical_outputs(
            self.spec.stack, self.run_dir, list(prompts.values()), wl.max_tokens
        )
        self.canonical = dict(zip(prompts, outs, strict=True))
        if self.attached:
            self.say("attaching to the operator's deployment")
            self.stack.up(self.spec.settings())
            self.client = BsrModuleClient(self.stack, timeout_s=30.0)
            self._configure_attached()
            return
        self.say("starting the serving stack")
        self.stack.up()
        self.client = BsrModuleClient(self.stack, timeout_s=30.0)

    def _configure_attached(self) -> None:
        """The matrix's W, B and timeouts on the operator's module (given back at close)."""
        assert self.client is not None
        config = self.client.status().config
        keys = ("window_chunks", "admission_budget_chunks", *TIMEOUTS)
        self.operator_config = {k: config[k] for k in keys if k in config}
        want = self.spec.settings()
        self.client.configure(
            window_chunks=want.window_chunks,
            admission_budget_chunks=want.budget_chunks,
            **{k: getattr(want, k) for k in TIMEOUTS},
        )

    def close(self) -> None:
        if self.client is not None:
            if self.attached and self.operator_config:
                try:
                    self.client.configure(**self.operator_config)
                except (StackFailed, OSError):
                    pass  # the deployment went away: nothing of ours to give back
            self.client.close()
        self.stack.down()

    def prompt(self, name: str, tokens: int | None = None) -> list[int]:
        wl = self.spec.workload
        return prompt_ids(f"{wl.salt}/{name}", tokens or wl.prompt_tokens, self.vocab)

    def reconnect(self) -> BsrModuleClient:
        if self.client is not None:
            self.client.close()
        self.client = BsrModuleClient(self.stack, timeout_s=30.0)
        if self.attached:  # a restarted server runs the operator's config: the matrix's again
            self._configure_attached()
        return self.client

    def ensure_up(self) -> None:
        """Restart a part a previous cell left down (bounded by the stack's own waits); an
        attached deployment is the operator's: a part down there is a StackFailed."""
        st = self.stack
        if self.attached:
            bad = sorted(n for n, h in st.health().items() if not h.get("healthy"))
            if bad:
                raise StackFailed(f"attach: {bad} not healthy before the cell (the operator's)")
            return
        for name in ("lmcache", "vllm"):
            part = st.parts.get(name)
            if part is None or not part.alive():
                self.say(f"  restarting {name} (left down)")
                if part is not None:
                    part.stop()
                st.parts.pop(name, None)
                (st.start_lmcache if name == "lmcache" else st.start_vllm)()
                if name == "lmcache":
                    self.reconnect()
        st._save_state()  # noqa: SLF001

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
        log = self.stack.vllm_log()
        if log is None and not self.attached:
            log = self.stack.dir / "vllm.log"
        if log is None:
            return None
        try:
            return Path(log).read_text(errors="replace").count(RECOVERED)
        except OSError:
            return None if self.attached else 0

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
        """Post-request health: a follow-up request answers, every part is healthy."""
        st = self.stack
        try:
            comp = st.complete(
                self.prompt("__health__", HEALTH_TOKENS), self.spec.workload.max_tokens
            )
        except StackFailed as exc:
            return False, f"follow-up request failed: {exc}"
        canon = self.canonical["__health__"]
        same = comp.output_token_ids == canon
        health = st.health()
        bad = [n for n, h in health.items() if not h.get("healthy")]
        ok = same and not bad
        return ok, (
            f"follow-up answered {len(comp.output_token_ids)} tokens "
            f"({'canonical' if same else 'NOT canonical'}) in {comp.ttft_s:.2f} s; "
            f"unhealthy parts {bad}"
        )

    def audit(self, stopped: list[int]) -> tuple[list[int], dict]:
        """Stopped and replaced PIDs are gone; every current part is alive (attached: every
        part answers; bsrctl holds none of their PIDs)."""
        st = self.stack
        if self.attached:
            return [], {n: bool(h.get("healthy")) for n, h in st.health().items()}
        current = set(st.all_pids())
        if st.mooncake is not None:
            current |= {p for p in st.mooncake.pids().values() if p}
        replaced = [p.pid for p in st.launched if p.pid and p.pid not in current]
        gone_expected = sorted({*stopped, *replaced} - current)
        alive = {n: p.alive() for n, p in st.parts.items()}
        if st.mooncake is not None:
            alive |= {
                "mooncake-master": st.mooncake.master.alive(),
                "mooncake-node": st.mooncake.node.alive(),
            }
        return pids_alive(gone_expected), alive
