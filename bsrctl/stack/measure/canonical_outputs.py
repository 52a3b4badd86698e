"""Canonical outputs: the same request on a vLLM with no KV connector at all (the model is
prepared in ``bsrctl.stack.launch.model``, the one home of folder and vocabulary).

Greedy decoding on the tiny model is deterministic across processes (CPU stack facts), so a
canonical output (its ids and each one's top-1 logprob, ``Reference``) is computed once per
key and cached under .cache/canonical/ (a file from before logprobs were kept is a miss).
The key holds everything that changes the numbers: the model (its files' sha256), the vLLM
version, the dtype, the KV cache dtype, the TP size and max_model_len (``numerics_key``),
the prompt and max_tokens. A model without a manifest (a user's folder) is never cached.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bsrctl.prompts import tokens_sha256
from bsrctl.specs import MooncakeSpec, StackSpec, VllmSpec
from bsrctl.stack.launch import tinymodel
from bsrctl.stack.launch.model import PreparedModel, prepare_model
from bsrctl.stack.launch.process import Supervised, http_ok
from bsrctl.stack.launch.serving import ServingStack
from bsrctl.stack.launch.serving.commands import reference_launch
from bsrctl.stack.launch.serving.shm import shm_segments
from bsrctl.stack.launch.serving.vllm_cache import vllm_cache_root
from bsrctl.stack.launch.versions import vllm_version
from bsrctl.stack.measure import reference_pool
from bsrkv.atomic import write_atomic


class PlainVllm(ServingStack):
    """The reference vLLM: no LMCache, no connector, the served deployment's TP, dtype and
    KV cache dtype (``reference_launch``)."""

    def up(self) -> None:
        self.shm_at_up = shm_segments()  # a pool's `stop_from_state` removes only its own
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = self._model()
        v = self.spec.vllm
        port = self._port("vllm.port", 0)
        vllm_cache_root(self.dir / "vllm-cache")  # its modelinfos shared (vllm_cache.py)
        launch = reference_launch(self.spec, self.model_dir, port, self.dir)
        log = self.dir / f"{launch.name}.log"
        part = Supervised(launch.name, list(launch.argv), log, env=dict(launch.env))
        try:
            self._launch(part)
            part.wait_healthy(lambda: http_ok(f"{self.vllm_url}/health"), v.startup_timeout_s)
        except BaseException:
            self.down()
            raise


@contextmanager
def _reference(spec: StackSpec, run_dir: Path) -> Iterator[PlainVllm]:
    """A running reference: the pool's (``reference_pool``, kept after the run) when
    ``BSRCTL_REFERENCE_POOL`` names one and vLLM runs on cpu, else the run's own under
    <run>/canonical, stopped by PID when the run's prompts are done. Never kept on cuda: the
    reference and the deployment must not hold the GPUs at once."""
    pool = reference_pool.pool_dir() if spec.device == "cpu" else None
    if pool is None:
        plain = PlainVllm(spec, run_dir / "canonical")
        plain.up()
        try:
            yield plain
        finally:
            plain.down()
        return
    model_dir = prepare_model(spec.vllm).folder
    with reference_pool.held(pool, reference_pool.launch_key(spec, model_dir)) as (entry, port):
        plain = PlainVllm(spec, entry)
        if port is None:
            plain.up()  # the pool's: close_pool stops it
        else:
            plain.ports, plain.model_dir = {"vllm.port": port}, model_dir
        yield plain


def numerics_key(vllm: VllmSpec) -> str:
    """The engine settings that change a greedy output: dtype, KV cache dtype, TP, length."""
    return (
        f"{vllm.dtype}-kv{vllm.kv_cache_dtype}-tp{vllm.tensor_parallel_size}"
        f"-len{vllm.max_model_len}"
    )


def cache_path(vllm: VllmSpec, model_sha: str, prompt_sha: str, max_tokens: int) -> Path:
    """Where the canonical output of one (model, vLLM version, numerics, prompt, max_tokens)
    is kept."""
    key = f"{model_sha[:16]}-{vllm_version()}-{numerics_key(vllm)}-{prompt_sha[:16]}-{max_tokens}"
    return tinymodel.default_cache_dir().parent / "canonical" / f"{key}.json"


@dataclass(frozen=True)
class Reference:
    """The reference's output of one prompt: greedy ids and each one's logprob."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # None: not reported (or cached before they were)


def divergence(
    out: tuple[int, ...],
    out_logprobs: tuple[float, ...] | None,
    ref: Reference | None,
) -> tuple[int | None, float | None]:
    """(first token index where ``out`` and the reference differ, None if identical; the
    largest |top-1 logprob gap| over the tokens before it, None without both logprobs)."""
    if ref is None:
        return None, None
    n = min(len(out), len(ref.ids))
    first = next((i for i in range(n) if out[i] != ref.ids[i]), None)
    if first is None and len(out) != len(ref.ids):
        first = n
    if out_logprobs is None or ref.logprobs is None:
        return first, None
    upto = n if first is None else first
    gaps = [abs(a - b) for a, b in zip(out_logprobs[:upto], ref.logprobs[:upto], strict=False)]
    return first, max(gaps, default=0.0)


def _cached(path: Path) -> Reference | None:
    """A cached reference; one cached before logprobs were recorded (a bare id list) misses."""
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        return None
    lps = doc.get("logprobs")
    return Reference(tuple(doc["ids"]), None if lps is None else tuple(lps))


def canonical_outputs(
    spec: StackSpec, run_dir: Path, prompts: list[list[int]], max_tokens: int
) -> list[tuple[int, ...]]:
    """Output ids of each prompt on a connector-less vLLM; starts one only on a cache miss."""
    return [r.ids for r in canonical_references(spec, run_dir, prompts, max_tokens)]


def canonical_references(
    spec: StackSpec, run_dir: Path, prompts: list[list[int]], max_tokens: int
) -> list[Reference]:
    """``canonical_outputs`` with each token's logprob (the output check's divergence)."""
    model_sha = prepare_model(spec.vllm).sha256
    paths = [cache_path(spec.vllm, model_sha, tokens_sha256(p), max_tokens) for p in prompts]
    cached = {i: _cached(p) for i, p in enumerate(paths) if model_sha}
    missing = [i for i in range(len(prompts)) if cached.get(i) is None]
    found: dict[int, Reference] = {}
    if missing:
        plain_spec = spec.model_copy(update={"mooncake": MooncakeSpec()})
        with _reference(plain_spec, Path(run_dir)) as plain:
            for i in missing:
                comp = plain.complete(prompts[i], max_tokens)
                found[i] = Reference(comp.output_token_ids, comp.token_logprobs)
                if model_sha:
                    doc = {"ids": list(comp.output_token_ids), "logprobs": comp.token_logprobs}
                    write_atomic(
                        paths[i], json.dumps(doc).encode()
                    )  # two runs at once: never half a file
    return [found.get(i) or cached[i] for i in range(len(prompts))]  # type: ignore[misc]


__all__ = [
    "PlainVllm",
    "PreparedModel",
    "Reference",
    "canonical_references",
    "divergence",
    "cache_path",
    "canonical_outputs",
    "numerics_key",
    "prepare_model",
]
