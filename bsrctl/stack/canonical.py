"""Canonical outputs: the same request on a vLLM with no KV connector at all.

Greedy decoding on the tiny model is deterministic across processes (STACK-NOTES), so a
canonical output is computed once per (model, vLLM version, prompt, max_tokens) and cached
under .cache/canonical/; the cache key is recorded in the evidence.
"""

from __future__ import annotations

import json
from pathlib import Path

from bsrctl.prompts import tokens_sha256
from bsrctl.specs import MooncakeSpec, StackSpec
from bsrctl.stack import tinymodel
from bsrctl.stack.process import Supervised, http_ok
from bsrctl.stack.serving import ServingStack, vllm_command, vllm_env
from bsrctl.stack.versions import vllm_version


class PlainVllm(ServingStack):
    """vLLM alone: no LMCache, no connector."""

    def up(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = self._model()
        v = self.spec.vllm
        port = self._port("vllm.port", 0)
        argv = vllm_command(v, self.model_dir, port)
        env = vllm_env(v, self.dir / "vllm-cache", connector=False)
        part = Supervised("vllm-plain", argv, self.dir / "vllm-plain.log", env=env)
        try:
            self._launch(part)
            part.wait_healthy(lambda: http_ok(f"{self.vllm_url}/health"), v.startup_timeout_s)
        except BaseException:
            self.down()
            raise


def cache_path(model_sha: str, prompt_sha: str, max_tokens: int) -> Path:
    """Where the canonical output of one (model, vLLM version, prompt, max_tokens) is kept."""
    key = f"{model_sha[:16]}-{vllm_version()}-{prompt_sha[:16]}-{max_tokens}"
    return tinymodel.default_cache_dir().parent / "canonical" / f"{key}.json"


def canonical_outputs(
    spec: StackSpec, run_dir: Path, prompts: list[list[int]], max_tokens: int
) -> list[tuple[int, ...]]:
    """Output ids of each prompt on a connector-less vLLM; starts one only on a cache miss."""
    model_sha = tinymodel.model_sha256(tinymodel.build()) if spec.vllm.model == "tiny" else ""
    paths = [cache_path(model_sha, tokens_sha256(p), max_tokens) for p in prompts]
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
