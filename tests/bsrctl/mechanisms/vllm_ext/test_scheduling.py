"""One decision of vLLM's async scheduling from the spec, the flag that makes vLLM resolve the
same (read back through vLLM 0.32's own argument parser and config), and the TempoKV
scheduler class that matches it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bsrctl.specs import StackSpec, VllmSpec
from bsrctl.stack.launch import profile
from bsrctl.stack.launch.extensions import (
    ASYNC_SCHEDULER,
    SYNC_SCHEDULER,
    TempoKVLaunch,
    tempokv_scheduler_cls,
)
from bsrkv.tempokv.live import AdapterSettings


def async_scheduling(device: str, requested: bool | None) -> bool:
    return profile.async_scheduling(
        StackSpec(device=device, vllm=VllmSpec(async_scheduling=requested))
    )


def async_scheduling_args(device: str, requested: bool | None) -> list[str]:
    """The scheduling flag of the profile's vLLM flags (cpu: none)."""
    stack = StackSpec(device=device, vllm=VllmSpec(async_scheduling=requested))
    flags = profile.profile_of(stack).vllm_flags
    return [f for f in flags if f.endswith("async-scheduling")]


def test_the_device_decides_unless_the_spec_does() -> None:
    assert [async_scheduling("cpu", r) for r in (None, False)] == [False, False]
    assert [async_scheduling("cuda", r) for r in (None, True, False)] == [True, True, False]
    with pytest.raises(ValidationError) as err:  # the spec refuses it (exit 2 at load)
        async_scheduling("cpu", True)
    # it names vLLM's method that does it, which test_the_cpu_platform_turns_it_off_as_decided
    # runs; a line number would go stale with any vLLM
    assert "stack.vllm.async_scheduling: true on device cpu" in str(err.value)
    assert "off (CpuPlatform.check_and_update_config); leave it unset" in str(err.value)
    # the CPU command line gains nothing; on CUDA the decision is always explicit
    assert [async_scheduling_args("cpu", r) for r in (None, False)] == [[], []]
    assert [async_scheduling_args("cuda", r) for r in (None, True, False)] == [
        ["--async-scheduling"], ["--async-scheduling"], ["--no-async-scheduling"]
    ]  # fmt: skip


def test_the_adapter_class_follows_the_decision() -> None:
    assert (tempokv_scheduler_cls(False), tempokv_scheduler_cls(True)) == (
        "bsrkv.vllm_ext.scheduler.TempoKVScheduler",
        "bsrkv.vllm_ext.scheduler.TempoKVAsyncScheduler",
    )
    assert (SYNC_SCHEDULER, ASYNC_SCHEDULER) == (
        tempokv_scheduler_cls(False), tempokv_scheduler_cls(True))  # fmt: skip
    adapter = AdapterSettings()
    assert TempoKVLaunch(adapter).scheduler_cls == SYNC_SCHEDULER  # the CPU default
    assert TempoKVLaunch(adapter, async_scheduling=True).scheduler_cls == ASYNC_SCHEDULER


@pytest.mark.parametrize("requested", [None, True, False])
def test_vllm_parses_the_flag_into_the_decision(requested: bool | None) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", "m", *async_scheduling_args("cuda", requested)])
    # explicit, so VllmConfig keeps it (vllm/config/vllm.py:1553-1584 only refuses an
    # incompatible explicit True; the None branch, the one that guesses, is never taken)
    assert args.async_scheduling is async_scheduling("cuda", requested)
    cpu = parser.parse_args(["--model", "m", *async_scheduling_args("cpu", None)])
    assert cpu.async_scheduling is None  # as before; the CPU platform turns it off


def test_the_cpu_platform_turns_it_off_as_decided() -> None:
    from vllm.config import ModelConfig, SchedulerConfig, VllmConfig

    from bsrctl.stack.launch import tinymodel

    model = ModelConfig(model=str(tinymodel.build()), dtype="float32", max_model_len=2048,
                        skip_tokenizer_init=True)  # fmt: skip
    for asked in (None, True):
        sched = SchedulerConfig(max_model_len=2048, is_encoder_decoder=False,
                                async_scheduling=asked)  # fmt: skip
        cfg = VllmConfig(model_config=model, scheduler_config=sched)
        assert cfg.scheduler_config.async_scheduling is async_scheduling("cpu", None) is False
        assert cfg.max_concurrent_batches == 1  # no batch queue: the sync loop
    # the method the spec's refusal names is the one that does it
    from vllm.platforms.cpu import CpuPlatform

    cfg.scheduler_config.async_scheduling = True
    CpuPlatform.check_and_update_config(cfg)
    assert cfg.scheduler_config.async_scheduling is False
