"""registration_identity over the derived, live and stored registrations; the live one as the
server module reads it from LMCache's cache context; a registration mismatch end to end on
the storage stack (store with one registration, restore declaring another)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import yaml

from bsrctl.evidence import Verdict, load_evidence
from bsrctl.experiments.restore import acceptance as acc
from bsrctl.registration.tiny import tiny_llama_cpu
from bsrkv.lmcache_ext.bsr.protocol import (
    LiveEngineGroup,
    LiveGroup,
    LiveRegistration,
    LiveTensor,
    RegistrationReply,
)
from bsrkv.lmcache_ext.server.layout import live_registrations

from .conftest import SMALL

C = 262_144
TINY = tiny_llama_cpu().geometry()
LIVE = tuple(f"kv[{i}]={g.split('=', 1)[1]}" for i, g in enumerate(TINY))


def identity(live=LIVE, stored=LIVE):
    return acc.registration_identity(C, C, None, None, TINY, live, stored)


def test_derived_live_and_stored_agree() -> None:
    c = identity()
    assert c.verdict == Verdict.PASS
    assert c.detail == (
        "no digest from this stack, 2 tensors derived == live == stored, 262144 B per chunk "
        "per rank"
    )


def test_a_live_or_stored_difference_fails_naming_the_first_tensor() -> None:
    other = (LIVE[0].replace("2, 32]", "4, 16]"), LIVE[1])  # same bytes, other heads
    c = identity(live=other)
    assert c.verdict == Verdict.FAIL
    assert c.detail == (
        "tensor 0 (model.layers.0.self_attn.attn): live [2, 256, 4, 16] float32 g0 != "
        "expected [2, 256, 2, 32] float32 g0"
    )
    assert identity(stored=LIVE[:1]).detail == "stored has 1 tensors, expected 2"


def test_a_registration_not_reported_is_unknown() -> None:
    assert identity(live=None).verdict == Verdict.UNKNOWN
    assert "the stored registration" in identity(stored=None).detail
    # a stack that reports no tensors is judged on bytes (and digest) alone, as before
    assert acc.registration_identity(C, C).verdict == Verdict.PASS


def _entry(shape_descs, layers, dtype="torch.float32", object_groups=None, fmt=None):
    kernel = [
        SimpleNamespace(
            layer_indices=ids,
            shape_desc=SimpleNamespace(kv_size=kv, nh=nh, hs=hs, bs=16),
            dtype=dtype,
            tokens_per_block=16,
            sw_size_tokens=-1,
            engine_group_idx=e,
            engine_kv_format=fmt,
        )
        for (kv, nh, hs, e), ids in zip(shape_descs, layers, strict=True)
    ]
    groups = object_groups or [SimpleNamespace(kernel_group_indices=[0], sw_size_chunks=-1)]
    for g in groups:
        g.__dict__.setdefault("aux", False)
        g.__dict__.setdefault("recurrent", False)
    n = sum(len(ids) for ids in layers)
    tensors = [SimpleNamespace(shape=(100, shape_descs[0][1], 16, 64)) for _ in range(n)]
    ctx = SimpleNamespace(
        kv_layer_groups_manager=SimpleNamespace(kernel_groups=kernel, object_groups=groups),
        kv_tensors=tensors,
        num_blocks=100,
    )
    return SimpleNamespace(cache_context=ctx, model_name="m", world_size=1)


def test_the_live_layout_reads_lmcaches_kernel_and_object_groups() -> None:
    # vLLM's CPU backend registers (blocks, kv heads, block size, 2 x head dim) per layer:
    # LMCache reads it as NL_X_NB_NH_BS_CS, one fused plane of content 2 x 32 (the tiny Llama)
    from lmcache.lmcache_native import EngineKVFormat

    entry = _entry([(1, 2, 64, 0)], [[0, 1]], fmt=EngineKVFormat.NL_X_NB_NH_BS_CS)
    (live,) = live_registrations(SimpleNamespace(context_entries_snapshot=lambda: {7: entry}), 256)
    assert [t.shape for t in live.tensors] == [(2, 256, 2, 32), (2, 256, 2, 32)]
    assert (live.instance_id, live.tensors[0].dtype, live.tensors[0].registered_shape) == (
        7,
        "float32",
        (100, 2, 16, 64),
    )
    assert live.groups == (LiveGroup(0, "attention", -1, (0,)),)
    assert live.engine_groups == (LiveEngineGroup(0, (0, 1), 16, -1, "NL_X_NB_NH_BS_CS"),)
    # an MLA latent (one "head" of 576) and a sliding-window object group of its own
    groups = [
        SimpleNamespace(kernel_group_indices=[0], sw_size_chunks=-1),
        SimpleNamespace(kernel_group_indices=[1], sw_size_chunks=16),
    ]
    two = _entry(
        [(1, 1, 576, 0), (1, 1, 576, 1)], [[0], [1]], "torch.bfloat16", groups,
        EngineKVFormat.NL_X_NB_BS_HS,
    )  # fmt: skip
    (live,) = live_registrations(SimpleNamespace(context_entries_snapshot=lambda: {1: two}), 256)
    assert [(t.shape, t.group) for t in live.tensors] == [((256, 576), 0), ((256, 576), 1)]
    assert live.groups[1] == LiveGroup(1, "attention", 16, (1,))
    assert live_registrations(None, 256) == ()


def test_the_registration_reply_round_trips() -> None:
    reply = RegistrationReply(
        (
            LiveRegistration(
                3, "m", 2, 256, 100, (LiveGroup(0, "attention", -1, (0,)),),
                (LiveEngineGroup(0, (0,), 16, -1, "NL_X_NB_NH_BS_CS"),),
                (LiveTensor(0, (2, 256, 1, 32), "float32", 0, (100, 1, 16, 64)),),
            ),
        )
    )  # fmt: skip
    wire = json.loads(json.dumps(reply.to_json()))
    assert RegistrationReply.from_json(wire) == reply


def test_store_with_one_registration_restore_declaring_another(tmp_path: Path) -> None:
    """The storage stack: a sweep stores the tiny Llama's prefix (keep_files), a second
    sweep over the same L2 declares the same model with other tensor shapes of the same bytes
    (4 KV heads of 16 instead of 2 of 32): bytes per chunk agree, the registration does not."""
    from bsrctl.experiments.restore.sweep import run_sweep

    root = tmp_path / "storage"
    base = yaml.safe_load(SMALL.format(tp=1, root=root, salt="t-reg"))
    base["storage"]["keep_files"] = True
    base["sweep"] = {"sizes_tokens": [1024], "window_chunks": 2, "repeats": 1}
    base.pop("ladder", None), base.pop("law", None)
    first = tmp_path / "a.yaml"
    first.write_text(yaml.safe_dump(base))
    assert run_sweep(first, tmp_path / "a", "storage", quiet=True) == Verdict.PASS
    other = {
        "model": "tiny-llama-cpu",  # the same keys: the stored objects are found and restored
        "chunk_tokens": 256,
        "tp_size": 1,
        "groups": [{"index": 0, "name": "attention"}],
        "tensors": [
            {
                "layers": [0, 2],
                "tensors": [
                    {"name": "model.layers.{i}.self_attn.attn", "shape": [2, "T", 4, 16],
                     "dtype": "float32"},
                ],
            }
        ],
    }  # fmt: skip
    second = tmp_path / "b.yaml"
    second.write_text(yaml.safe_dump(base | {"registration": other}))
    assert run_sweep(second, tmp_path / "b", "storage", quiet=True) == Verdict.FAIL
    (run,) = [p for p in (tmp_path / "b").iterdir() if p.is_dir()]
    (point,) = load_evidence(run / "evidence.json")["points"]
    checks = {c["name"]: c for c in point["checks"]}
    assert checks["registration_identity"]["verdict"] == "FAIL"
    assert checks["registration_identity"]["detail"] == (
        "tensor 0 (model.layers.0.self_attn.attn): stored [2, 256, 2, 32] float32 g0 != "
        "expected [2, 256, 4, 16] float32 g0"
    )
    assert point["measures"]["bytes_per_chunk_measured"] == C  # bytes alone would pass
    assert checks["cached_token_accounting"]["verdict"] == "PASS"
