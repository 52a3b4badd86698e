"""``bsrctl stack plan SPEC [--json]``: every process a spec's deployment would start, with its
command line and the variables bsrctl sets, and the figures it implies; starts nothing, needs
no GPU and reads nothing of a model but its config.json (``stack.vllm.config_json``).

The processes are built by the launchers' own builders (``serving.commands`` ``*_launch``,
``mooncake.mooncake_launches``) over ``Slots`` whose run-time choices are stable
placeholders: a port 0 becomes ``<vllm.port>`` (``<lmcache.port>``, ``<mooncake.rpc_port>``,
...), the run folder ``<run>``, a namespace holder's PID ``<netns.pid>``. What `stack up`
deploys is W = 0 (``bsr.configure`` sets each request's W); the reference vLLM
(``vllm-reference``) runs before the deployment, on a canonical-output cache miss.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bsrctl.errors import BadInput
from bsrctl.spec_io import describe_error, read_yaml
from bsrctl.specs import StackSpec, TargetSpec, model_config
from bsrctl.stack.launch import profile, versions
from bsrctl.stack.launch.extensions import bsr_extensions
from bsrctl.stack.launch.model import model_folder
from bsrctl.stack.launch.netns import LOOPBACK, nsenter_prefix
from bsrctl.stack.launch.serving.commands import (
    Launch,
    Port,
    Slots,
    lmcache_launch,
    reference_launch,
    vllm_launch,
)
from bsrctl.stack.launch.serving.mooncake import (
    BINARIES,
    MooncakeEndpoints,
    Transport,
    adapter_params,
    mooncake_dir,
    mooncake_launches,
)
from bsrctl.stack.launch.tinymodel import TinyModelRecipe
from bsrctl.stack.launch.twohost import SERVING_ADDR, STORAGE_ADDR
from bsrkv.settings import RestoreSettings

RUN = Path("<run>")  # the run folder (reports/<run_id>/ or `stack up --run-dir`)
# Dense architectures whose weights `figures` counts from config.json alone (no biases).
DENSE = ("LlamaForCausalLM", "MistralForCausalLM")
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


@dataclass(frozen=True)
class Plan:
    processes: tuple[Launch, ...]
    figures: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"processes": [p.to_json() for p in self.processes], "figures": dict(self.figures)}


def placeholder(asked: int, name: str) -> Port:
    """The port a spec asks for, or a stable placeholder for the one picked at start."""
    return asked if asked else f"<{name}>"


def processes(stack: StackSpec, settings: RestoreSettings) -> tuple[Launch, ...]:
    """What a serving deployment of ``stack`` starts, in start order: the reference vLLM
    (then stopped), Mooncake's master and node, LMCache, vLLM. Other kinds start nothing
    (storage runs in-process; attach reaches the operator's)."""
    if stack.kind != "serving":
        return ()
    lm, mc = stack.lmcache, stack.mooncake
    ports = {
        "lmcache.port": placeholder(lm.port, "lmcache.port"),
        "lmcache.http_port": placeholder(lm.http_port, "lmcache.http_port"),
        "vllm.port": placeholder(stack.vllm.port, "vllm.port"),
    }
    model_dir = model_folder(stack.vllm)
    # canonical_outputs: a vLLM of its own under <run>/canonical, no Mooncake, a free port
    ref = reference_launch(stack, model_dir, "<vllm-reference.port>", RUN / "canonical" / "stack")
    out = [ref]
    prefix: tuple[str, ...] = ()
    params: dict[str, Any] | None = None
    if mc.enabled:
        two = mc.topology == "two-hosts"
        prefix = tuple(nsenter_prefix("<serving-netns.pid>" if two else "<netns.pid>"))
        store_prefix = tuple(nsenter_prefix("<storage-netns.pid>")) if two else prefix
        ep = MooncakeEndpoints(
            "<mooncake.rpc_port>",
            "<mooncake.metrics_port>",
            "<mooncake.node_port>",
            STORAGE_ADDR if two else LOOPBACK,
        )
        root = mooncake_dir() or Path("<mooncake>")
        bins = {name: root / name for name in BINARIES}
        transport = Transport.of(mc)
        out += mooncake_launches(bins, ep, str(mc.segment_size_bytes), transport, store_prefix)
        params = adapter_params(ep, transport)
        if two:
            params["local_hostname"] = SERVING_ADDR
    ext = bsr_extensions(settings)
    # the launched stack's token is drawn at start: a plan shows where it goes, not a value
    slots = Slots(ports, RUN / "stack", model_dir, prefix, params, control_token="<control-token>")
    out += [lmcache_launch(stack, ext, slots, lm.l1_size_bytes), vllm_launch(stack, ext, slots)]
    return tuple(out)


def figures(spec: TargetSpec, doc: Mapping[str, Any]) -> dict[str, Any]:
    """c, W·c per rank for each W the spec names, L1, the largest whole plan, and on cuda
    the GPU memory per rank that config.json implies."""
    stack = spec.stack
    kind = "storage" if stack.kind == "storage" else "serving"
    reg = spec.registration_for(kind)
    tp, chunk, c = reg.tp_size, spec.chunk_tokens, reg.bytes_per_chunk
    windows = _windows(doc)
    largest = max(_sizes(doc), default=0)
    whole_chunks = largest // chunk
    # one L1 holds every rank's chunks on the serving stack; the storage stack has one per rank
    whole = whole_chunks * c * (1 if kind == "storage" else tp)
    out: dict[str, Any] = {
        "kind": stack.kind,
        "device": stack.device,
        "tensor_parallel_size": tp,
        "dtype": stack.vllm.dtype,
        "kv_cache_dtype": stack.vllm.kv_cache_dtype,
        "registration": reg.model,
        "chunk_tokens": chunk,
        "c_bytes_per_rank": c,
        "aux_bytes_per_rank": reg.aux_bytes,
        "window_chunks": windows,
        "w_c_bytes_per_rank": {str(w): w * c for w in windows},
        "l1_size_bytes": stack.lmcache.l1_size_bytes,
        "largest_whole_plan": {
            "tokens": largest,
            "chunks": whole_chunks,
            "bytes": whole,
            "fits_l1": whole <= stack.lmcache.l1_size_bytes,
        },
        "gpu_memory_per_rank": None,
    }
    if stack.kind == "serving":
        out["vllm"] = _vllm_figures(stack)
    if stack.device == "cuda":
        out["gpus"] = list(profile.gpus(stack.vllm))
        out["gpu_memory_per_rank"] = _gpu_memory(stack, c // chunk)
    return out


def _vllm_figures(stack: StackSpec) -> dict[str, Any]:
    """The vLLM the plan is for and what it defaults that the launch depends on: the block
    size (``num_gpu_blocks_override`` blocks hold that many tokens each: 4x more on 0.34's
    CUDA default of 64 than on 0.32's 16) and whether the extensible KV cache exists (the
    cuda profile turns it off)."""
    version = versions.target_vllm_version()
    block = profile.kv_block_size(stack, version)
    blocks = stack.vllm.num_gpu_blocks_override
    return {
        "version": version,
        "block_size": block,
        "kv_pool_tokens": blocks * block if blocks is not None and block is not None else None,
        "extensible_kv_cache": versions.vllm_defaults(version).extensible_kv_cache,
    }


def _gpu_memory(stack: StackSpec, kv_per_token: int) -> dict[str, Any]:
    """What one rank's GPU holds for this deployment: the KV of one max_model_len request and
    the weights (counted from config.json for dense Llama-like models, else None)."""
    v = stack.vllm
    return {
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "kv_bytes_per_token": kv_per_token,
        "kv_bytes_max_model_len": kv_per_token * v.max_model_len,
        "weights_bytes": _weights_per_rank(stack),
    }


def _weights_per_rank(stack: StackSpec) -> int | None:
    """Dense decoder weights per rank from config.json: embeddings, attention, MLP and norms,
    all but the norms split over the TP ranks (vLLM's vocab-/column-/row-parallel layers)."""
    v = stack.vllm
    cfg = TinyModelRecipe().hf_config() if v.model == "tiny" else model_config(v)
    if not set(cfg.get("architectures") or ()) & set(DENSE):
        return None
    dtype = v.dtype if v.dtype != "auto" else str(cfg.get("torch_dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        return None
    try:  # the tiny recipe's config has no vocab (trained at build): not counted, no crash
        h, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        hd = int(cfg.get("head_dim") or h // heads)
        vocab, inter = int(cfg["vocab_size"]), int(cfg["intermediate_size"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    per_layer = h * hd * (2 * heads + 2 * kv) + 3 * h * inter  # q, o, k, v; gate, up, down
    heads_out = 1 if cfg.get("tie_word_embeddings") else 2
    split = layers * per_layer + heads_out * vocab * h
    replicated = (2 * layers + 1) * h  # RMSNorm weights
    tp = v.tensor_parallel_size
    return (math.ceil(split / tp) + replicated) * DTYPE_BYTES[dtype]


def _windows(doc: Mapping[str, Any]) -> list[int]:
    """Every W the spec writes (sweep.window_chunks, law.windows_chunks), sorted."""
    sweep, law = doc.get("sweep"), doc.get("law")
    ws = [sweep.get("window_chunks")] if isinstance(sweep, dict) else []
    ws += _items(law.get("windows_chunks")) if isinstance(law, dict) else []
    return sorted(set(_counts(ws)))


def _sizes(doc: Mapping[str, Any]) -> list[int]:
    """Every prefix size the spec's sections name (tokens)."""
    got: list[Any] = []
    for section in ("ladder", "sweep"):
        part = doc.get(section) or {}
        got += _items(part.get("sizes_tokens")) if isinstance(part, dict) else []
    law = doc.get("law") or {}
    got += [law.get("tokens")] if isinstance(law, dict) else []
    got += [doc.get("prompt_tokens")]  # the round trip's
    return _counts(got)


def _items(value: Any) -> list[Any]:
    """A raw section's list (the plan reads sections it does not validate: anything else
    is no list of figures, never a crash)."""
    return list(value) if isinstance(value, list) else []


def _counts(values: list[Any]) -> list[int]:
    return [n for n in values if isinstance(n, int) and not isinstance(n, bool) and n > 0]


def plan_spec(path: Path, vllm_version: str | None = None) -> Plan:
    """The plan of the spec at ``path`` (any spec with a `stack:` section), for vLLM
    ``vllm_version`` (None: the installed one)."""
    if vllm_version is not None and len(versions.release(vllm_version)) < 2:
        raise BadInput(f"--vllm-version: {vllm_version!r} is no vLLM release; give one (0.34.0)")
    doc = read_yaml(path)
    known = {k: doc[k] for k in TargetSpec.model_fields if k in doc}
    try:
        spec = TargetSpec.model_validate(known)
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe_error(TargetSpec, exc)}") from None
    try:
        settings = spec.settings(0)
        with versions.planning_for(vllm_version):
            return Plan(processes(spec.stack, settings), figures(spec, doc))
    except BadInput as exc:
        raise BadInput(f"{path}: {exc}") from None


def render(plan: Plan) -> str:
    """The plan as an operator reads it: each process's variables and command line, then
    the figures."""
    lines: list[str] = []
    for p in plan.processes:
        lines.append(f"# {p.name}")
        lines += [f"{k}={v}" for k, v in p.env.items()]
        lines.append(" ".join(shlex.quote(a) for a in p.argv))
        lines.append("")
    lines.append("# figures")
    lines += [f"{k}: {json.dumps(v)}" for k, v in plan.figures.items()]
    return "\n".join(lines) + "\n"


__all__ = ["Plan", "figures", "placeholder", "plan_spec", "processes", "render"]
