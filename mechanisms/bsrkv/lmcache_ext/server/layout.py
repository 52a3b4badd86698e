"""The live registration: the KV cache layout each engine instance really registered.

vLLM's connector sends REGISTER_KV_CACHE with its per-layer KV tensors (no names, in layer
order) and the ``EngineGroupInfo`` groups; LMCache's lmcache-driven transfer module keeps a
cache context per instance whose kernel groups describe every layer (engine KV format, K/V
or latent, heads, head size, slots per block, dtype) and whose object groups are what
LMCache stores, one
object per chunk and rank. This module reads them back per tensor, per chunk, in the same
shape convention as a registration derived from the model: ``(2, T, heads, head_dim)`` for K and V,
``(T, width)`` for a single latent.

vLLM 0.32 registers every layer as a fused ``[B, H, N, C]`` view and sends no ``use_mla``;
LMCache's detector reads an MLA latent ``[B, N, 1, 576]`` as a one-head fused K/V plane
(``NL_X_NB_BS_NH_CS``, kv_size 1, nh 1, hs 576), so this module reports it as
``(2, T, 1, 288)``: the same bytes. Which it is follows from the model, which only the
client knows: the client reads it against the registration it derived.
"""

from __future__ import annotations

from typing import Any

from bsrkv.lmcache_ext.bsr.protocol import LiveEngineGroup, LiveGroup, LiveRegistration, LiveTensor


def _dtype(d: Any) -> str:
    return str(d).removeprefix("torch.")


def per_chunk_shape(
    kv_size: int, heads: int, head_size: int, slots: int, fused: bool
) -> tuple[int, ...]:
    """A layer's slice of one chunk of ``slots`` engine slots. ``fused``: K and V packed in
    the content axis (vLLM's CPU backend: ``[blocks, heads, block, 2 * head_dim]``)."""
    if fused:
        return (2, slots, heads, head_size // 2)
    if kv_size == 2:
        return (2, slots, heads, head_size)
    return (slots, head_size) if heads == 1 else (slots, heads, head_size)


def is_fused(engine_kv_format: Any) -> bool:
    """Whether LMCache's spec of this engine KV format packs K and V in one content axis."""
    if engine_kv_format is None:
        return False
    from lmcache.v1.gpu_connector.kv_format.specs.registry import get_spec_class

    return bool(get_spec_class(engine_kv_format).is_fused_packed)


def live_registration(instance_id: int, entry: Any, chunk_tokens: int) -> LiveRegistration:
    """One transfer-module ContextEntry as a LiveRegistration."""
    ctx = entry.cache_context
    manager = ctx.kv_layer_groups_manager
    kernel = manager.kernel_groups
    owner = {k: og for og, o in enumerate(manager.object_groups) for k in o.kernel_group_indices}
    layer_of: dict[int, tuple[int, Any]] = {}
    for k, group in enumerate(kernel):
        for layer in group.layer_indices:
            layer_of[layer] = (k, group)
    tensors = []
    for i, t in enumerate(ctx.kv_tensors):
        k, group = layer_of[i]
        sd = group.shape_desc
        per_block = group.tokens_per_block or sd.bs  # logical tokens per block (0: as slots)
        slots = chunk_tokens * sd.bs // per_block
        tensors.append(
            LiveTensor(
                index=i,
                shape=per_chunk_shape(
                    sd.kv_size, sd.nh, sd.hs, slots, is_fused(group.engine_kv_format)
                ),
                dtype=_dtype(group.dtype),
                group=owner.get(k, 0),
                registered_shape=tuple(int(d) for d in t.shape),
            )
        )
    groups = tuple(
        LiveGroup(
            index=og,
            kind="aux" if o.aux else "recurrent" if o.recurrent else "attention",
            sliding_window_chunks=o.sw_size_chunks,
            engine_group_ids=tuple(
                sorted({kernel[k].engine_group_idx for k in o.kernel_group_indices})
            ),
        )
        for og, o in enumerate(manager.object_groups)
    )
    engine_groups = tuple(
        LiveEngineGroup(
            engine_group_id=int(g.engine_group_idx),
            layer_indices=tuple(int(i) for i in g.layer_indices),
            tokens_per_block=int(g.tokens_per_block),
            sw_size_tokens=int(getattr(g, "sw_size_tokens", -1)),
            engine_kv_format=getattr(g.engine_kv_format, "name", str(g.engine_kv_format)),
        )
        for g in kernel
    )
    return LiveRegistration(
        instance_id=int(instance_id),
        model_name=str(entry.model_name),
        world_size=int(entry.world_size),
        chunk_tokens=int(chunk_tokens),
        num_blocks=int(ctx.num_blocks),
        groups=groups,
        engine_groups=engine_groups,
        tensors=tuple(tensors),
    )


def live_registrations(transfer_mod: Any, chunk_tokens: int) -> tuple[LiveRegistration, ...]:
    """Every instance registered with the lmcache-driven transfer module (none without it)."""
    if transfer_mod is None:
        return ()
    entries = transfer_mod.context_entries_snapshot()
    return tuple(live_registration(i, e, chunk_tokens) for i, e in sorted(entries.items()))
