"""What an attached deployment must offer before bsrctl measures anything, each checked up
front from what its servers answer, with the exact flag or variable to add when missing.

- the BSR server module in ``lmcache server`` (its status under ``bsr`` in ``/status``);
- the control token: ``stack.attach.control_token_env`` names a variable set in bsrctl's
  environment (the token the operator gave the server module, ``bsrkv.control_token``);
  a server that refuses it answers "control token ..." and the run stops (exit 3) naming
  the variable;
- ``VLLM_SERVER_DEV_MODE=1`` in vLLM's environment: vLLM 0.32 registers
  ``/reset_prefix_cache`` only then (vllm/entrypoints/launchers/api_server/routers.py:40-43,
  vllm/entrypoints/serve/dev/cache/api_router.py:20). The route takes POST only, so a GET
  answers 405 where it exists and 404 where it does not: a probe without side effects;
- ``--enable-prompt-tokens-details``: without it vLLM leaves ``usage.prompt_tokens_details``
  out of every answer (vllm/entrypoints/openai/completion/serving.py:608-615), so the
  cached-token count every check rests on is missing: read from a 3-token probe completion
  (no whole chunk: nothing is stored);
- the transfer mode: BSR's windows are copied by the server, so both sides need
  ``lmcache_driven``. LMCache's server defaults to it (lmcache/v1/multiprocess/config.py:82)
  and reports ``registered_gpu_ids`` only when it runs that module and
  ``registered_non_cuda_instance_ids`` only when it runs the engine-driven one
  (server.py:232-239, modules/*_transfer.py report_status); vLLM's connector on CPU picks
  engine-driven unless told (lmcache/v1/platform/devices/cpu/__init__.py:86-94).

The checks are pure functions of those answers (tested with recorded ones); ``missing``
gives one line per prerequisite missing, in this order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEV_MODE = (
    "vLLM: set VLLM_SERVER_DEV_MODE=1 in its environment and restart it (without it vLLM "
    "serves no /reset_prefix_cache, which bsrctl calls before every restore)"
)
PROMPT_DETAILS = (
    "vLLM: add --enable-prompt-tokens-details to its command line (without it vLLM reports no "
    "usage.prompt_tokens_details.cached_tokens, the count every restore check reads)"
)
SERVER_MODE = (
    "LMCache: add --supported-transfer-mode lmcache_driven (or auto) to `lmcache server` (it "
    "runs engine_driven only; BSR's windows are copied by the server)"
)
ENGINE_MODE = (
    'vLLM: add "lmcache.mp.mp_transfer_mode": "lmcache_driven" to kv_connector_extra_config '
    "in --kv-transfer-config (its connector registered engine-driven, the CPU default; BSR's "
    "windows are copied by the server)"
)


def control_token_refused(error: str, source: str) -> str:
    """The StackFailed text when the server refuses a mutating call: the server's reason
    and where bsrctl's token comes from (the variable to set)."""
    return (
        f"LMCache server module: {error}; bsrctl's token comes from {source}: set it to the "
        "token the operator gave the server module ($BSRKV_CONTROL_TOKEN in its environment)"
    )


def control_token_missing(env: str | None) -> str:
    """'' when bsrctl has a token to send, else the line naming the variable to set."""
    import os

    if env is None:
        return (
            "bsrctl: set stack.attach.control_token_env to the variable holding the server "
            "module's control token (its mutating methods refuse a caller without it)"
        )
    if not os.environ.get(env):
        return (
            f"bsrctl: ${env} (stack.attach.control_token_env) is not set in bsrctl's "
            "environment: export the server module's control token there"
        )
    return ""


def no_registration(lmcache_url: str) -> str:
    return (
        f"vLLM: no engine registered its KV cache with the LMCache server at {lmcache_url}; "
        "point --kv-transfer-config's lmcache.mp.host and lmcache.mp.port at it"
    )


def dev_mode_line(reset_route_status: int | None) -> str:
    """'' when GET /reset_prefix_cache shows the route exists (405: POST only), else why."""
    return DEV_MODE if reset_route_status == 404 else ""


def prompt_details_line(usage: Mapping[str, Any] | None) -> str:
    """'' when the probe's usage carries prompt_tokens_details.cached_tokens, else why."""
    details = (usage or {}).get("prompt_tokens_details")
    return "" if isinstance(details, Mapping) and "cached_tokens" in details else PROMPT_DETAILS


def transfer_mode_line(status: Mapping[str, Any], lmcache_url: str) -> str:
    """'' when the server runs lmcache_driven transfer and vLLM registered that way."""
    if "registered_gpu_ids" not in status:
        return SERVER_MODE
    if status.get("registered_non_cuda_instance_ids"):
        return ENGINE_MODE
    if not status.get("registered_gpu_ids"):
        return no_registration(lmcache_url)
    return ""


def missing(
    reset_route_status: int | None,
    usage: Mapping[str, Any] | None,
    status: Mapping[str, Any],
    lmcache_url: str,
) -> list[str]:
    """One line per missing prerequisite (the module is checked before, with its own line)."""
    lines = [
        dev_mode_line(reset_route_status),
        prompt_details_line(usage),
        transfer_mode_line(status, lmcache_url),
    ]
    return [ln for ln in lines if ln]


def message(lines: list[str]) -> str:
    """The StackFailed text: what is missing, one line each, nothing measured yet."""
    head = f"attach: the deployment misses {len(lines)} prerequisite(s); nothing was measured:"
    return "\n".join([head, *(f"  - {ln}" for ln in lines)])
