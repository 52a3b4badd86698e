"""A request running in a thread: the failure matrix's concurrent cells and the soak's rounds
send theirs this way, each answer timed from its send."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Background:
    """A request running in a thread, started at construction; ``answer_s`` is send ->
    answer (or explicit error), None until it returned. The soak sends its rounds this way."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._box: dict[str, Any] = {}
        self.sent_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._box["result"] = fn()
        except BaseException as exc:  # recorded as the request's explicit error
            self._box["error"] = exc
        self._box["answer_s"] = time.monotonic() - self.sent_s

    @property
    def answer_s(self) -> float | None:
        return self._box.get("answer_s")

    def wait(self, timeout_s: float) -> tuple[Any, BaseException | None, bool]:
        self._thread.join(timeout_s)
        return self._box.get("result"), self._box.get("error"), not self._thread.is_alive()
