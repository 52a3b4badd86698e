"""ServingStack.forget_local: vLLM refuses /reset_prefix_cache while a finished request's KV
save still holds blocks; the reset is asked again until accepted or the bound has passed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bsrctl.errors import StackFailed
from bsrctl.specs import StackSpec
from bsrctl.stack.launch.serving import ServingStack


class Answers(ServingStack):
    def __init__(self, answers: list[Any], run_dir: Path) -> None:
        super().__init__(StackSpec(), run_dir)
        self.ports = {"vllm.port": 1}
        self.answers, self.calls = answers, []

    def _http(
        self, method: str, url: str, body: Any = None, timeout_s: float = 30, headers: Any = None
    ) -> Any:
        self.calls.append((method, url))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_reset_is_retried_until_the_save_released_its_blocks(tmp_path: Path) -> None:
    st = Answers([{"success": False}, {"success": False}, {"success": True}], tmp_path)
    st.forget_local(wait_s=10.0)
    assert st.calls == [("POST", "http://127.0.0.1:1/reset_prefix_cache")] * 3


def test_a_reset_refused_past_the_bound_fails_the_stack_explicitly(tmp_path: Path) -> None:
    st = Answers([{"success": False}], tmp_path)
    with pytest.raises(StackFailed, match=r"refused /reset_prefix_cache for 0 s"):
        st.forget_local(wait_s=0.0)
    assert len(st.calls) == 1


class Counters(ServingStack):
    """vLLM's metrics before and after one request, and its completion reply."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(StackSpec(), run_dir)
        self.ports = {"vllm.port": 1}
        self.model_dir = Path("/models/tiny")
        self.metric_texts = [
            '# HELP x\nvllm:external_prefix_cache_hits_total{engine="0"} 512\n'
            "vllm:time_to_first_token_seconds_count 2\nvllm:time_to_first_token_seconds_sum 0.5\n",
            'vllm:external_prefix_cache_hits_total{engine="0"} 640\n'
            'vllm:external_prefix_cache_hits_total{engine="1"} 128\n'
            "vllm:time_to_first_token_seconds_count 3\nvllm:time_to_first_token_seconds_sum 0.75\n",
        ]
        self.bodies: list[Any] = []

    def _http(
        self, method: str, url: str, body: Any = None, timeout_s: float = 30, headers: Any = None
    ) -> Any:
        if url.endswith("/metrics"):
            return self.metric_texts.pop(0)
        self.bodies.append((url, body, timeout_s))
        return {
            "choices": [{"token_ids": [7, 8, 9]}],
            "usage": {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}},
        }


def test_complete_reads_vllms_own_counters_around_the_request(tmp_path: Path) -> None:
    st = Counters(tmp_path)
    c = st.complete([5, 6], max_tokens=3)
    assert (c.output_token_ids, c.prompt_tokens, c.cached_tokens) == ((7, 8, 9), 300, 256)
    assert c.external_hit_tokens == 256  # summed over label sets: 768 - 512
    assert c.ttft_s == 0.25  # the TTFT histogram moved exactly once: its sum's delta
    assert st.bodies == [
        (
            "http://127.0.0.1:1/v1/completions",
            {
                "model": "/models/tiny",
                "prompt": [5, 6],
                "max_tokens": 3,
                "temperature": 0.0,
                "ignore_eos": True,
                "return_token_ids": True,
                "logprobs": 1,  # the output check's top-1 logprobs
            },
            300.0,
        )
    ]
    assert c.token_logprobs is None  # this reply carries none


def test_complete_reads_the_top1_logprobs_when_vllm_sends_them(tmp_path: Path) -> None:
    st = Counters(tmp_path)
    reply = {
        "choices": [{"token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.5, -1.25]}}],
        "usage": {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 0}},
    }
    st._http = lambda m, u, b=None, t=30, h=None: (
        st.metric_texts.pop(0) if u.endswith("/metrics") else reply
    )  # type: ignore[method-assign]
    assert st.complete([5, 6], max_tokens=2).token_logprobs == (-0.5, -1.25)


def test_a_vllm_gone_before_the_request_is_a_stack_failure(tmp_path: Path) -> None:
    class Gone(ServingStack):
        def __init__(self) -> None:
            super().__init__(StackSpec(), tmp_path)
            self.ports = {"vllm.port": 1}

        def _http(
            self,
            method: str,
            url: str,
            body: Any = None,
            timeout_s: float = 30,
            headers: Any = None,
        ) -> Any:
            raise ConnectionRefusedError(111, "Connection refused")  # the metrics read fails

    with pytest.raises(StackFailed, match=r"vLLM request failed .*; vLLM process gone"):
        Gone().complete([5, 6], max_tokens=3)


class NoDetails(Counters):
    """vLLM started without --enable-prompt-tokens-details: no prompt_tokens_details."""

    def _http(
        self, method: str, url: str, body: Any = None, timeout_s: float = 30, headers: Any = None
    ) -> Any:
        if url.endswith("/metrics"):
            return self.metric_texts.pop(0)
        return {"choices": [{"token_ids": [7]}], "usage": {"prompt_tokens": 300}}


def test_an_unreported_cached_token_count_is_none_never_zero(tmp_path: Path) -> None:
    c = NoDetails(tmp_path).complete([5, 6], max_tokens=1)
    assert c.cached_tokens is None
    assert (c.prompt_tokens, c.external_hit_tokens) == (300, 256)  # the rest is read as before


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"prompt_tokens": 3}, None),
        ({"prompt_tokens_details": None}, None),  # vLLM's own default (serve/engine/protocol.py)
        ({"prompt_tokens_details": {"cached_tokens": None}}, None),
        ({"prompt_tokens_details": {"cached_tokens": 0}}, 0),  # a measured 0
        ({"prompt_tokens_details": {"cached_tokens": 3840}}, 3840),
    ],
)
def test_reported_cached_tokens(usage: dict[str, Any], cached: int | None) -> None:
    from bsrctl.stack.launch.serving.client import reported_cached_tokens

    assert reported_cached_tokens(usage) == cached


def test_the_checks_read_an_unreported_count_as_unknown_with_its_reason() -> None:
    from bsrctl.evidence import Verdict
    from bsrctl.experiments.restore.acceptance import cached_token_accounting, tier_isolation

    c = cached_token_accounting(None, 3840, 3840)
    assert (c.verdict, c.detail) == (
        Verdict.UNKNOWN,
        "not measured: vLLM reported no usage.prompt_tokens_details.cached_tokens (start it "
        "with --enable-prompt-tokens-details)",
    )
    t = tier_isolation("fs", 0, None, {"fs": 2 << 20}, 3840)
    assert (t.verdict, t.detail) == (Verdict.UNKNOWN, "not measured: cached tokens")
