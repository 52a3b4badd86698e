"""Canonical outputs: the same request on a vLLM with no KV connector at all (the model is
prepared in ``bsrctl.stack.model``, the one home of folder and vocabulary).

Greedy decoding on the tiny model is deterministic across processes (STACK-NOTES), so a
canonical output is computed once per key and cached under .cache/canonical/. The key holds
everything that changes the numbers: the model (its files' sha256), the vLLM version, the
dtype, the KV cache dtype, the TP size and max_model_len (``numerics_key``), the prompt and
max_tokens. A model without a manifest (a user's folder) is never cached.
"""

from __future__ import annotations

import json
from pathlib import Path

from bsrctl.prompts import tokens_sha256
from bsrctl.specs import MooncakeSpec, StackSpec, VllmSpec
from bsrctl.stack import tinymodel
from bsrctl.stack.model import PreparedModel, prepare_model
from bsrctl.stack.process import Supervised, http_ok
from bsrctl.stack.serving import ServingStack
from bsrctl.stack.serving.commands import reference_launch
from bsrctl.stack.versions import vllm_version


class PlainVllm(ServingStack):
    """The reference vLLM: no LMCache, no connector, the served deployment's TP, dtype and
    KV cache dtype (``reference_launch``)."""

    def up(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = self._model()
        v = self.spec.vllm
        port = self._port("vllm.port", 0)
        launch = reference_launch(self.spec, self.model_dir, port, self.dir)
        log = self.dir / f"{launch.name}.log"
        part = Supervised(launch.name, list(launch.argv), log, env=dict(launch.env))
        try:
            self._launch(part)
            part.wait_healthy(lambda: http_ok(f"{self.vllm_url}/health"), v.startup_timeout_s)
        except BaseException:
            self.down()
            raise


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


def canonical_outputs(
    spec: StackSpec, run_dir: Path, prompts: list[list[int]], max_tokens: int
) -> list[tuple[int, ...]]:
    """Output ids of each prompt on a connector-less vLLM; starts one only on a cache miss."""
    model_sha = prepare_model(spec.vllm).sha256
    paths = [cache_path(spec.vllm, model_sha, tokens_sha256(p), max_tokens) for p in prompts]
    missing = [i for i, p in enumerate(paths) if not model_sha or not p.is_file()]
    found: dict[int, tuple[int, ...]] = {}
    if missing:
        plain_spec = spec.model_copy(update={"mooncake": MooncakeSpec()})
        plain = PlainVllm(plain_spec, Path(run_dir) / "canonical")
        plain.up()
        try:
            for i in missing:
                out = plain.complete(prompts[i], max_tokens).output_token_ids
                found[i] = out
                if model_sha:
                    paths[i].parent.mkdir(parents=True, exist_ok=True)
                    paths[i].write_text(json.dumps(list(out)))
        finally:
            plain.down()
    return [
        found[i] if i in found else tuple(json.loads(paths[i].read_text()))
        for i in range(len(prompts))
    ]


__all__ = [
    "PlainVllm",
    "PreparedModel",
    "cache_path",
    "canonical_outputs",
    "numerics_key",
    "prepare_model",
]
