"""Canonical outputs: the same request on a vLLM with no KV connector at all.

Greedy decoding on the tiny model is deterministic across processes (STACK-NOTES), so a
canonical output is computed once per (model, vLLM version, prompt, max_tokens) and cached
under .cache/canonical/; the cache key is recorded in the evidence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bsrctl.prompts import tokens_sha256
from bsrctl.specs import MooncakeSpec, StackSpec
from bsrctl.stack import tinymodel
from bsrctl.stack.process import Supervised, http_ok
from bsrctl.stack.serving import ServingStack, base_env


class PlainVllm(ServingStack):
    """vLLM alone: no LMCache, no connector."""

    def up(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model_dir = self._model()
        v = self.spec.vllm
        port = self._port("vllm.port", 0)
        argv = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--enforce-eager", "--max-model-len", str(v.max_model_len), "--dtype", "float32",
            "--seed", "0", "--max-num-seqs", "4", "--enable-prompt-tokens-details",
            "--no-enable-prefix-caching",
        ]  # fmt: skip
        env = {
            **base_env(),
            "VLLM_CPU_KVCACHE_SPACE": str(v.kvcache_space_gib),
            "VLLM_CACHE_ROOT": str(self.dir / "vllm-cache"),
        }
        part = Supervised("vllm-plain", argv, self.dir / "vllm-plain.log", env=env)
        try:
            self._launch(part)
            part.wait_healthy(lambda: http_ok(f"{self.vllm_url}/health"), v.startup_timeout_s)
        except BaseException:
            self.down()
            raise


def _cache_path(model_sha: str, prompt_sha: str, max_tokens: int) -> Path:
    from importlib.metadata import version

    key = f"{model_sha[:16]}-{version('vllm-cpu')}-{prompt_sha[:16]}-{max_tokens}"
    return tinymodel.default_cache_dir().parent / "canonical" / f"{key}.json"


def canonical_outputs(
    spec: StackSpec, run_dir: Path, prompts: list[list[int]], max_tokens: int
) -> list[tuple[int, ...]]:
    """Output ids of each prompt on a connector-less vLLM; starts one only on a cache miss."""
    model_sha = tinymodel.model_sha256(tinymodel.build()) if spec.vllm.model == "tiny" else ""
    paths = [_cache_path(model_sha, tokens_sha256(p), max_tokens) for p in prompts]
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
