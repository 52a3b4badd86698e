"""ServingStack.forget_local: vLLM refuses /reset_prefix_cache while a finished request's KV
save still holds blocks; the reset is asked again until accepted or the bound has passed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bsrctl.errors import StackFailed
from bsrctl.specs import StackSpec
from bsrctl.stack.serving import ServingStack


class Answers(ServingStack):
    def __init__(self, answers: list[Any], run_dir: Path) -> None:
        super().__init__(StackSpec(), run_dir)
        self.ports = {"vllm.port": 1}
        self.answers, self.calls = answers, []

    def _http(self, method: str, url: str, body: Any = None, timeout_s: float = 30) -> Any:
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
