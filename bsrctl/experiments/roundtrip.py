"""The round trip: store a prompt's KV in LMCache, make vLLM forget it, reload it per tier.

Tiers: l1 (LMCache DRAM), fs (filesystem L2, L1 emptied first), mooncake (L1 emptied and the
filesystem L2's files moved aside, so only the Mooncake store can serve it).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bsrctl.errors import BadInput
from bsrctl.evidence import EvidenceWriter, Point, Verdict
from bsrctl.evidence.guards import with_guards
from bsrctl.evidence.verdict import Check, check
from bsrctl.experiments.restore.acceptance import canonical_output, tier_isolation
from bsrctl.experiments.run import execute, progress
from bsrctl.prompts import expected_external_tokens, prompt_ids, tokens_sha256
from bsrctl.spec_io import load_spec
from bsrctl.specs import RoundTripSpec
from bsrctl.stack.contracts.deployment import FOLLOW_UP_MAX_TOKENS, FOLLOW_UP_PROMPT_TOKENS
from bsrctl.stack.contracts.guards import GuardWatch
from bsrctl.stack.launch.model import prepare_model
from bsrctl.stack.launch.serving import Completion, ServingStack, check_ports
from bsrctl.stack.measure.canonical_outputs import canonical_outputs
from bsrctl.stack.measure.tiers import mooncake_stored_keys, wait_written_through
from bsrctl.stack.selector import make_deployment
from bsrkv.settings import RestoreSettings


@contextlib.contextmanager
def only_tier(stack: ServingStack, tier: str) -> Iterator[None]:
    """Arrange that only `tier` can serve the next load, and undo it afterwards."""
    fs_dir = stack.dir / "l2-fs"
    hidden = stack.dir / "l2-fs.hidden"
    if tier in ("fs", "mooncake"):
        stack.clear_l1()
    if tier == "mooncake" and fs_dir.exists():
        fs_dir.rename(hidden)
        fs_dir.mkdir()
    try:
        yield
    finally:
        if hidden.exists():
            shutil.rmtree(fs_dir, ignore_errors=True)
            hidden.rename(fs_dir)


def tier_point(
    tier: str,
    comp: Completion,
    canonical: tuple[int, ...],
    expected_ext: int,
    tokens: int,
    reads: dict[str, int],
    l1_bytes_before: int | None,
) -> Point:
    out_sha = tokens_sha256(comp.output_token_ids)
    canon_sha = tokens_sha256(canonical)
    want = 0 if tier == "cold" else expected_ext
    checks: list[Check] = [
        check(
            "cached_token_accounting",
            comp.external_hit_tokens == want,
            f"external hits {comp.external_hit_tokens}, expected {want}",
        ),
        canonical_output(out_sha, canon_sha),
    ]
    if tier != "cold":
        checks.append(
            tier_isolation(
                tier, l1_bytes_before, comp.cached_tokens, reads, comp.external_hit_tokens, "keys"
            )
        )
    return Point(
        id=tier,
        params={"tier": tier, "tokens": tokens},
        measures={
            "tokens": tokens,
            "cached_tokens": comp.cached_tokens,
            "external_hit_tokens": comp.external_hit_tokens,
            "expected_cached_tokens": want,
            "output_sha256": out_sha,
            "canonical_sha256": canon_sha,
            "ttft_s": round(comp.ttft_s, 4),
            "request_s": round(comp.request_s, 4),
            "l2_keys_served": reads,
            "l1_bytes_before_restore": l1_bytes_before,
        },
        checks=tuple(checks),
    )


def run_roundtrip(spec_path: Path, out_dir: Path, quiet: bool = False) -> Verdict:
    """Store, forget and reload the spec's prompt through each tier; the run verdict."""
    spec, raw = load_spec(spec_path, RoundTripSpec)
    if spec.stack.kind == "attach":
        raise BadInput(
            f"{spec_path}: stack.kind: attach: the round trip hides the FS tier's files and "
            "launches its own stack; use kind serving"
        )
    say = progress(quiet)
    check_ports(spec.stack)  # a port in use: bad input before any run folder
    ids = prompt_ids(spec.salt, spec.prompt_tokens, prepare_model(spec.stack.vllm).vocab)
    writer = EvidenceWriter(out_dir, "roundtrip", raw, spec.salt, {"kind": "serving"})
    dep = make_deployment(spec.stack, writer.run_dir, RestoreSettings.of(spec.restore, 0))

    def body(w: EvidenceWriter) -> tuple[dict[str, Any], list[Check]]:
        say("canonical output on a vLLM with no KV connector")
        (canonical,) = canonical_outputs(spec.stack, w.run_dir, [ids], spec.max_tokens)
        say("starting the serving stack")
        dep.up(dep.settings)
        stack, client = dep.stack, dep.client
        assert client is not None
        w.set_stack(dep.describe())
        expected = expected_external_tokens(spec.prompt_tokens, spec.stack.lmcache.chunk_size)
        say("cold request (stores KV into LMCache)")
        l2 = tuple(t for t in ("fs", "mooncake") if t in spec.tiers)
        mc_before = mooncake_stored_keys(stack) if "mooncake" in l2 else 0
        written: dict[str, int] = {}
        watch = GuardWatch()
        for tier in ["cold", *spec.tiers]:
            watch.start(client)
            if tier != "cold":
                say(f"reload from {tier}")
            before = stack.tier_reads()
            with only_tier(stack, tier):
                stack.forget_local()
                # measured: what only_tier left (the cold request has no tier to isolate)
                l1_before = None if tier == "cold" else client.peak().l1_used_bytes
                comp = stack.complete(ids, spec.max_tokens)
            after = stack.tier_reads()
            reads = {name: after[name] - before.get(name, 0) for name in after}
            point = tier_point(
                tier, comp, canonical, expected, spec.prompt_tokens, reads, l1_before
            )
            w.add_point(with_guards(point, watch.end(client)))
            if tier == "cold" and l2:  # an L1 emptied before the write-through loses it
                chunk = spec.stack.lmcache.chunk_size
                written = wait_written_through(stack, ids, chunk, l2, 30.0, mc_before)
        follow = dep.follow_up(ids[:FOLLOW_UP_PROMPT_TOKENS], FOLLOW_UP_MAX_TOKENS)
        health = check("post_request_health", follow.ok, follow.detail)
        summary = {"tiers": spec.tiers, "l2_chunks_written_after_cold": written}
        return summary, [health]

    return execute(writer, body, dep.down, say)
