"""Each prerequisite an attached deployment lacks is exit 3 before anything is measured, with
the exact line naming the flag or variable to add (a fake deployment answering as vLLM 0.32
and LMCache 0.5.6 do without it); with all of them, none is named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from fake_deployment import (  # noqa: E402
    FAKE_TOKEN_ENV,
    USAGE_OK,
    Answers,
    attach_section,
    fake_deployment,
)

from bsrctl.cli import app  # noqa: E402
from bsrctl.stack.attach import prerequisites as pre  # noqa: E402

SMOKE = Path(__file__).parents[3] / "ladders" / "cpu-smoke.yaml"
HEAD = "stack failed: attach: the deployment misses {n} prerequisite(s); nothing was measured:"


def sweep(tmp_path: Path, ans: Answers) -> tuple[int, list[str]]:
    code, lines, _ = sweep_on(tmp_path, ans)
    return code, lines


def sweep_on(
    tmp_path: Path, ans: Answers, token_env: str | None = FAKE_TOKEN_ENV
) -> tuple[int, list[str], int]:
    with fake_deployment(ans) as port:
        section = attach_section(port, token_env)
        text = SMOKE.read_text().replace(
            "stack:\n  kind: serving\n", f"stack:\n  kind: attach\n{section}"
        )
        spec = tmp_path / "spec.yaml"
        spec.write_text(text)
        res = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    return res.exit_code, lines, port


def no_prompt_details() -> dict:
    return {k: v for k, v in USAGE_OK.items() if k != "prompt_tokens_details"}


def engine_driven_status(ans: Answers) -> dict:
    st = dict(ans.status)
    del st["registered_gpu_ids"], st["cache_context_meta"]
    st["registered_non_cuda_instance_ids"] = [7]
    return st


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (lambda a: setattr(a, "reset_route", 404), pre.DEV_MODE),
        (lambda a: setattr(a, "usage", no_prompt_details()), pre.PROMPT_DETAILS),
        (lambda a: setattr(a, "status", engine_driven_status(a)), pre.SERVER_MODE),
        (  # server auto, vLLM's connector engine-driven (the CPU default)
            lambda a: a.status.update(registered_non_cuda_instance_ids=[7], registered_gpu_ids=[]),
            pre.ENGINE_MODE,
        ),
    ],
    ids=["no-dev-mode", "no-prompt-tokens-details", "server-engine-driven", "vllm-engine-driven"],
)
def test_a_missing_prerequisite_is_exit_3_naming_the_fix(tmp_path: Path, change, line) -> None:
    ans = Answers()
    change(ans)
    code, lines = sweep(tmp_path, ans)
    assert code == 3, lines
    assert lines[-2:] == [HEAD.format(n=1), f"  - {line}"]
    assert not any("Traceback" in ln for ln in lines)
    # checked before anything was measured: no reset, no request but the 3-token probe
    assert "POST /reset_prefix_cache" not in ans.seen


def test_the_exact_lines() -> None:
    assert pre.DEV_MODE.startswith("vLLM: set VLLM_SERVER_DEV_MODE=1 in its environment")
    assert pre.PROMPT_DETAILS.startswith("vLLM: add --enable-prompt-tokens-details to its")
    assert pre.SERVER_MODE.startswith(
        "LMCache: add --supported-transfer-mode lmcache_driven (or auto)"
    )
    assert pre.ENGINE_MODE.startswith(
        'vLLM: add "lmcache.mp.mp_transfer_mode": "lmcache_driven" to kv_connector_extra_config'
    )


def test_every_missing_prerequisite_is_named_at_once(tmp_path: Path) -> None:
    ans = Answers(reset_route=404, usage=no_prompt_details())
    ans.status["registered_gpu_ids"] = []  # lmcache_driven, but no engine registered
    code, lines, port = sweep_on(tmp_path, ans)
    assert code == 3
    assert lines[-4:] == [
        HEAD.format(n=3),
        f"  - {pre.DEV_MODE}",
        f"  - {pre.PROMPT_DETAILS}",
        f"  - {pre.no_registration(f'tcp://127.0.0.1:{port}')}",
    ]


def test_a_deployment_with_every_prerequisite_names_none() -> None:
    from fake_deployment import STATUS_OK

    assert pre.missing(405, USAGE_OK, STATUS_OK, "tcp://h:1") == []
    # the server in auto mode (both modules) with vLLM registered lmcache-driven
    auto = {**STATUS_OK, "registered_non_cuda_instance_ids": []}
    assert pre.missing(405, USAGE_OK, auto, "tcp://h:1") == []
    assert pre.dev_mode_line(None) == ""  # no answer is the /health probe's to report


@pytest.mark.parametrize("token_env", [None, "BSRCTL_UNSET_TOKEN_VAR"], ids=["unnamed", "unset"])
def test_no_control_token_is_exit_3_naming_the_variable(tmp_path: Path, token_env) -> None:
    """Every mutating bsr.* call would be refused: stopped before anything is measured."""
    code, lines, _ = sweep_on(tmp_path, Answers(), token_env)
    assert code == 3, lines
    assert lines[-2:] == [HEAD.format(n=1), f"  - {pre.control_token_missing(token_env)}"]
    want = (
        "$BSRCTL_UNSET_TOKEN_VAR (stack.attach.control_token_env)"
        if token_env
        else ("set stack.attach.control_token_env")
    )
    assert want in lines[-1]
    assert not any("Traceback" in ln for ln in lines)
