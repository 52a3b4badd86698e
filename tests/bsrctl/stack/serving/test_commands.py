"""The one home of the serving stack's command lines: exact argv and environments."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bsrctl.specs import LmcacheSpec, StackSpec, VllmSpec
from bsrctl.stack.launch.serving.commands import (
    VENV_BIN,
    base_env,
    lmcache_command,
    vllm_command,
    vllm_env,
)

HEAD = [
    sys.executable, "-m", "vllm.entrypoints.openai.api_server",
    "--model", "/models/m", "--host", "127.0.0.1", "--port", "8000",
    "--enforce-eager", "--max-model-len", "4096", "--dtype", "float32",
    "--seed", "0", "--max-num-seqs", "4", "--enable-prompt-tokens-details",
]  # fmt: skip


def test_lmcache_server_command() -> None:
    argv = lmcache_command(
        LmcacheSpec(chunk_size=256),
        5555,
        5556,
        3 << 29,
        [{"type": "a"}, {"type": "b"}],
        {"module_path": "m", "config": {"k": 1}},
    )
    assert argv == [
        str(VENV_BIN / "lmcache"), "server",
        "--host", "127.0.0.1", "--port", "5555",
        "--l1-size-gb", "1.5",
        "--no-l1-use-lazy",
        "--eviction-policy", "LRU",
        "--chunk-size", "256",
        "--http-host", "127.0.0.1", "--http-port", "5556",
        "--disable-observability", "--disable-metrics",
        "--supported-transfer-mode", "auto",
        "--l2-adapter", '{"type": "a"}',
        "--l2-adapter", '{"type": "b"}',
        "--server-module", '{"module_path": "m", "config": {"k": 1}}',
    ]  # fmt: skip


def _cpu(**vllm: object) -> StackSpec:
    return StackSpec(vllm=VllmSpec(**vllm))


def test_vllm_behind_the_connector() -> None:
    v = _cpu(max_model_len=4096, tensor_parallel_size=2)
    argv = vllm_command(v, Path("/models/m"), 8000, lmcache_port=5555)
    assert argv[: len(HEAD)] == HEAD
    tail = argv[len(HEAD) :]
    assert tail[:3] == ["--tensor-parallel-size", "2", "--kv-transfer-config"]
    assert json.loads(tail[3]) == {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {
            "lmcache.mp.host": "tcp://127.0.0.1",
            "lmcache.mp.port": 5555,
            "lmcache.mp.mp_transfer_mode": "lmcache_driven",
            "lmcache.mp.mq_timeout": 60.0,
        },
    }
    assert len(tail) == 4


def test_plain_vllm_has_no_connector_and_no_prefix_cache() -> None:
    # the reference runs at the served deployment's TP (it once returned before TP)
    v = _cpu(max_model_len=4096, tensor_parallel_size=2)
    assert vllm_command(v, Path("/models/m"), 8000) == [
        *HEAD, "--tensor-parallel-size", "2", "--no-enable-prefix-caching",
    ]  # fmt: skip


def test_vllm_environments(tmp_path: Path) -> None:
    v = _cpu(kvcache_space_gib=3, tensor_parallel_size=2)
    plain = vllm_env(v, tmp_path / "c", connector=False)
    # TP > 1 binds one core per rank on the reference too: it runs at the served TP now
    assert plain.pop("VLLM_CPU_OMP_THREADS_BIND") in ("0|1", "0|0")  # 1 CPU: both on 0
    assert plain == {
        **base_env(),
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "VLLM_CACHE_ROOT": str(tmp_path / "c"),
    }
    served = vllm_env(v, tmp_path / "c")
    assert served.pop("VLLM_SERVER_DEV_MODE") == "1"  # /reset_prefix_cache
    assert served.pop("VLLM_CPU_OMP_THREADS_BIND") in ("0|1", "0|0")  # 1 CPU: both on 0
    assert served == plain
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_env(StackSpec(), tmp_path)
    assert base_env()["HF_HUB_OFFLINE"] == "1" and base_env()["VLLM_HOST_IP"] == "127.0.0.1"


def test_engine_cores_bind_canonical_and_served_vllm_alike(tmp_path: Path) -> None:
    v = _cpu(cpu_threads_bind="0")
    for connector in (False, True):
        assert vllm_env(v, tmp_path, connector=connector)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    tp2 = _cpu(cpu_threads_bind="0", tensor_parallel_size=2)
    for connector in (False, True):  # TP > 1: one core per rank, reference and served alike
        bind = vllm_env(tp2, tmp_path, connector=connector)["VLLM_CPU_OMP_THREADS_BIND"]
        assert bind in ("0|1", "0|0")


def test_tempokv_engine_leaves_the_last_core() -> None:
    from bsrctl.tempokv.experiments.serving import engine_cpus_default

    assert [engine_cpus_default(n) for n in (1, 2, 3, 16)] == [None, "0", "0-1", "0-14"]
