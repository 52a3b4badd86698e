"""DeepSeek-V4-Flash under ``registration: auto``: the mirror (``bsrctl.registration.dsv4``)
pinned to the byte, equal to what vLLM 0.32's own layers register (``dsv4_vllm``, in its own
process: it initialises torch.distributed), and the connector it needs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bsrctl.errors import BadInput
from bsrctl.registration import dsv4
from bsrctl.specs import TargetSpec, VllmSpec
from bsrctl.stack.launch.serving.commands import vllm_command

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "ladders" / "models" / "DeepSeek-V4-Flash" / "config.json"
CFG = json.loads(CONFIG.read_text())

# per 256-token chunk per rank: (caches, shape, dtype, bytes of one) by kind
EXPECTED = {
    "swa_cache": (43, (256, 584), "uint8", 149_504),
    "c4 latent": (21, (64, 584), "uint8", 37_376),
    "c128 latent": (20, (2, 584), "uint8", 1_168),
    "indexer.k_cache": (21, (64, 132), "uint8", 8_448),
    "c4 compressor": (21, (256, 2048), "float32", 2_097_152),
    "indexer compressor": (21, (256, 512), "float32", 524_288),
    "c128 compressor": (20, (256, 1024), "float32", 1_048_576),
}


def _kind(name: str, shape: tuple[int, ...]) -> str:
    if name.endswith("indexer.compressor.state_cache"):
        return "indexer compressor"
    if name.endswith("compressor.state_cache"):
        return "c4 compressor" if shape[1] == 2048 else "c128 compressor"
    if name.endswith(("swa_cache", "indexer.k_cache")):
        return name.rsplit(".", 1)[-1] if "swa" in name else "indexer.k_cache"
    return "c4 latent" if shape[0] == 64 else "c128 latent"


def test_the_flash_registration_to_the_byte() -> None:
    reg = dsv4.derive_dsv4(CFG, tp_size=2, chunk_tokens=256, name="DeepSeek-V4-Flash")
    kinds = Counter(_kind(t.name, t.shape) for t in reg.tensors)
    assert kinds == {k: v[0] for k, v in EXPECTED.items()}
    for t in reg.tensors:
        _, shape, dtype, nbytes = EXPECTED[_kind(t.name, t.shape)]
        assert (t.shape, t.dtype, t.nbytes) == (shape, dtype, nbytes), t.name
    assert reg.num_tensors == 167 and reg.engine_groups == 5
    assert reg.bytes_per_chunk == sum(n * b for n, _, _, b in EXPECTED.values()) == 83_436_096
    assert reg.groups == (dsv4.GroupSpec(0, "attention"),)
    assert reg.window_bytes(32) == 2_669_955_072  # more than the spec's 1 GiB L1
    assert [t.name for t in reg.tensors[:7]] == [
        "model.layers.0.attn.swa_cache",
        "model.layers.1.attn.swa_cache",
        "model.layers.2.attn.indexer.k_cache",
        "model.layers.2.attn.indexer.compressor.state_cache",
        "model.layers.2.attn.swa_cache",
        "model.layers.2.attn",
        "model.layers.2.attn.compressor.state_cache",
    ]


def test_separate_object_groups_split_windows_from_compressed() -> None:
    reg = dsv4.derive_dsv4(CFG, tp_size=2, chunk_tokens=256, separate_object_groups=True)
    assert reg.groups == (
        dsv4.GroupSpec(0, "sliding_window", 1),
        dsv4.GroupSpec(1, "compressed"),
    )
    assert (len(reg.group_tensors(0)), len(reg.group_tensors(1))) == (105, 62)
    assert reg.group_bytes_per_chunk(0) == 82_450_432
    assert reg.group_bytes_per_chunk(1) == 985_664


def test_chunk_and_cache_dtype_vllm_and_lmcache_refuse_are_bad_input() -> None:
    with pytest.raises(BadInput, match="stack.lmcache.chunk_size: 128 is not a multiple of 256"):
        dsv4.derive_dsv4(CFG, tp_size=2, chunk_tokens=128)
    with pytest.raises(BadInput, match="stack.vllm.kv_cache_dtype: 'float16'"):
        dsv4.derive_dsv4(CFG, tp_size=2, chunk_tokens=256, kv_cache_dtype="float16")
    fp8 = dsv4.derive_dsv4(CFG, tp_size=2, chunk_tokens=256, kv_cache_dtype="fp8")
    assert fp8.digest() == dsv4.derive_dsv4(CFG, tp_size=2, chunk_tokens=256).digest()


def _spec(connector: str | None) -> TargetSpec:
    vllm = {"model": "/nowhere/DeepSeek-V4-Flash", "config_json": str(CONFIG)}
    vllm |= {"tensor_parallel_size": 2} | ({"connector": connector} if connector else {})
    return TargetSpec.model_validate({"stack": {"device": "cuda", "vllm": vllm}})


def test_auto_needs_lmcaches_connector() -> None:
    with pytest.raises(BadInput) as e:
        _spec(None).registration_for("serving")
    assert str(e.value).startswith("stack.vllm.connector: vllm, but DeepSeek-V4-Flash has 5 vLLM")
    assert str(e.value).endswith("set stack.vllm.connector: lmcache")
    reg = _spec("lmcache").registration_for("serving")
    assert (reg.model, reg.bytes_per_chunk, reg.tp_size) == ("DeepSeek-V4-Flash", 83_436_096, 2)
    assert _spec(None).registration_for("storage").num_tensors == 167  # no vLLM there


def test_the_connector_field_is_the_module_path_in_vllms_argv() -> None:
    def kv(connector: str) -> dict[str, object]:
        stack = _spec(connector).stack
        argv = vllm_command(stack, Path("/m"), 8000, lmcache_port=9000)
        return json.loads(argv[argv.index("--kv-transfer-config") + 1])

    assert "kv_connector_module_path" not in kv("vllm")
    lm = kv("lmcache")
    assert (lm["kv_connector"], lm["kv_connector_module_path"]) == (
        "LMCacheMPConnector",
        "lmcache.integration.vllm.lmcache_mp_connector",
    )
    assert VllmSpec().connector == "vllm"


def test_lmcaches_connector_class_is_where_the_argv_points() -> None:
    mod = pytest.importorskip("lmcache.integration.vllm.lmcache_mp_connector")
    assert "SupportsHMA" in [b.__name__ for b in mod.LMCacheMPConnector.__mro__]


@pytest.fixture(scope="module")
def vllm_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    pytest.importorskip("vllm.config")
    folder = tmp_path_factory.mktemp("models") / "DeepSeek-V4-Flash"
    folder.mkdir()
    shutil.copy(CONFIG, folder / "config.json")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bsrctl.registration.dsv4_vllm", str(folder)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("separate", [False, True])
def test_the_mirror_is_what_vllms_layers_register(vllm_doc, separate: bool) -> None:
    from bsrctl.registration import dsv4_vllm

    how = {"tp_size": 2, "chunk_tokens": 256, "separate_object_groups": separate}
    theirs = dsv4_vllm.registration(vllm_doc, **how)  # type: ignore[arg-type]
    ours = dsv4.derive_dsv4(CFG, name="DeepSeek-V4-Flash", **how)  # type: ignore[arg-type]
    assert ours.geometry() == theirs.geometry()
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    assert ours.groups == theirs.groups and ours.engine_groups == theirs.engine_groups
    assert ours.digest() == theirs.digest()


def test_vllms_own_view_of_the_flash_caches(vllm_doc) -> None:
    doc = vllm_doc
    assert (doc["attention_class"], doc["block_size"], doc["cache_dtype"], doc["layout"]) == (
        "DeepseekV4FlashMLAAttention", 256, "fp8_ds_mla", "BLHNC",
    )  # fmt: skip
    specs = doc["specs"]
    assert {(s["num_kv_heads"], s["max_tp_shards"]) for s in specs} == {(1, 1)}  # replicated
    pages = Counter(
        (s["class"], s["block_size"], s["page_size_bytes"], s["real_page_size_bytes"],
         s["tokens_per_state"], s["sliding_window"])
        for s in specs
    )  # fmt: skip
    assert pages == {
        ("SlidingWindowMLASpec", 64, 37_440, 37_376, 1, 128): 43,  # swa_cache
        ("MLAAttentionSpec", 256, 37_440, 37_376, 4, None): 21,  # c4 latent
        ("MLAAttentionSpec", 256, 1_728, 1_168, 128, None): 20,  # c128 latent
        ("MLAAttentionSpec", 256, 8_640, 8_448, 4, None): 21,  # indexer keys
        ("SlidingWindowMLASpec", 4, 32_832, 32_768, 1, 8): 21,  # c4 compressor
        ("SlidingWindowMLASpec", 4, 8_640, 8_192, 1, 8): 21,  # indexer compressor
        ("SlidingWindowMLASpec", 8, 32_832, 32_768, 1, 128): 20,  # c128 compressor
    }
    assert [(len(g["layers"]), g["block_size"]) for g in doc["groups"]] == [  # type: ignore[index]
        (22, 64), (21, 64), (62, 256), (42, 4), (20, 8),
    ]  # fmt: skip
