"""The serving stack's client calls: vLLM's completions, metrics and local-cache reset, and
LMCache's HTTP status and L1 clear (inside the stack's network namespace when it has one)."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bsrctl.errors import StackFailed
from bsrctl.specs import StackSpec
from bsrctl.stack.launch.netns import NetNamespace, maybe_inside
from bsrctl.stack.launch.process import Supervised
from bsrctl.stack.launch.serving.commands import MQ_TIMEOUT_S
from bsrctl.trace.spans import client_request, first_token, new_request_id


@dataclass(frozen=True)
class Completion:
    output_token_ids: tuple[int, ...]  # generated ids, greedy
    prompt_tokens: int  # as vLLM counted them
    # usage.prompt_tokens_details.cached_tokens (local + external); None: vLLM did not report
    # it (started without --enable-prompt-tokens-details): missing evidence, never 0
    cached_tokens: int | None
    external_hit_tokens: int  # delta of vllm:external_prefix_cache_hits_total
    ttft_s: float  # time to first token as vLLM measured it (its TTFT histogram's delta)
    request_s: float  # wall time of the whole (non-streamed) request, client side
    # logprob of each generated (greedy: top-1) token, as vLLM reports it (None: not sent)
    token_logprobs: tuple[float, ...] | None = None
    request_id: str = ""  # the X-Request-Id sent: the server's outcomes carry it in theirs


@dataclass(frozen=True)
class Streamed:
    output_token_ids: tuple[int, ...]
    sent_s: float  # monotonic, when the request was sent
    first_token_s: float  # monotonic, first streamed token (client-side TTFT = this - sent)
    done_s: float  # monotonic, last chunk read
    request_id: str = ""  # the X-Request-Id sent (its spans carry it)


class ServingClient:
    """HTTP calls on a running deployment; ``ServingStack`` is one (it holds the ports)."""

    spec: StackSpec
    ports: dict[str, int]
    ns: NetNamespace | None
    parts: dict[str, Supervised]
    model_dir: Path | None
    # the token mutating bsr.* / tempokv.* calls carry (bsrkv.control_token), and where it
    # comes from, for the message when the server refuses it
    control_token: str | None = None
    control_token_source: str = "the launched stack's own token"

    @property
    def vllm_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['vllm.port']}"

    @property
    def lmcache_http(self) -> str:
        return f"http://127.0.0.1:{self.ports['lmcache.http_port']}"

    @property
    def lmcache_mq_url(self) -> str:
        """The MP server's request socket (the connector's and bsr.* calls)."""
        return f"tcp://127.0.0.1:{self.ports['lmcache.port']}"

    @property
    def model_name(self) -> str:
        """The model name requests carry: the folder vLLM was started with."""
        return str(self.model_dir)

    @property
    def fs_l2_dir(self) -> Path:
        """Where the FS tier's object files are (seeding and faults read them)."""
        raise NotImplementedError

    def fault_control(self, tier: str) -> Path:
        """The control file a tier's fault wrapper re-reads (rules armed by writing it)."""
        raise NotImplementedError

    def fault_tiers(self) -> tuple[str, ...]:
        """The tiers behind a fault wrapper whose rules bsrctl can arm."""
        return ("fs", "mooncake")

    def vllm_log(self) -> Path | None:
        """vLLM's log, where it reports each recovery from a KV load failure."""
        part = self.parts.get("vllm")
        return part.log_path if part else None

    def _http(
        self,
        method: str,
        url: str,
        body: Any = None,
        timeout_s: float = 30,
        headers: dict[str, str] | None = None,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        req.add_header("Content-Type", "application/json")
        with maybe_inside(self.ns), urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters, summed over label sets."""
        text = self._http("GET", f"{self.vllm_url}/metrics")
        out: dict[str, float] = {}
        for line in str(text).splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            key = name.split("{", 1)[0]
            try:
                out[key] = out.get(key, 0.0) + float(value)
            except ValueError:
                continue
        return out

    def complete(self, prompt_ids: list[int], max_tokens: int) -> Completion:
        """One greedy request by token ids; raises StackFailed when vLLM does not answer
        (the request, or the metrics read around it: a vLLM gone between requests too)."""
        body = {
            "model": self.model_name,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "logprobs": 1,  # the output check compares top-1 logprobs with the reference's
        }
        try:
            before = self.metrics()
            rid = new_request_id()
            with client_request(rid) as (headers, _):
                t0 = time.monotonic()
                resp = self._http(
                    "POST", f"{self.vllm_url}/v1/completions", body,
                    self.spec.vllm.request_timeout_s, headers,
                )  # fmt: skip
                elapsed = time.monotonic() - t0
            after = self.metrics()
        except OSError as exc:
            part = self.parts.get("vllm")
            if getattr(self, "attached", False):  # its process is the operator's, not ours
                raise StackFailed(f"vLLM request to {self.vllm_url} failed ({exc})") from None
            # A killed server drops the connection a moment before it can be reaped: give it
            # a bounded moment so "gone" is not misreported as "alive".
            alive = part is not None and part.wait_exit(timeout_s=5.0) is None
            raise StackFailed(
                f"vLLM request failed ({exc}); vLLM process {'alive' if alive else 'gone'}",
                part.tail() if part else "",
            ) from None
        usage = resp.get("usage") or {}
        lps = (resp["choices"][0].get("logprobs") or {}).get("token_logprobs")
        return Completion(
            output_token_ids=tuple(resp["choices"][0]["token_ids"]),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=reported_cached_tokens(usage),
            external_hit_tokens=int(_delta(after, before, "vllm:external_prefix_cache_hits_total")),
            ttft_s=_ttft_s(after, before, elapsed),
            request_s=elapsed,
            token_logprobs=None if lps is None else tuple(float(x) for x in lps),
            request_id=rid,
        )

    def stream(self, prompt_ids: list[int], max_tokens: int) -> Streamed:
        """One greedy request, streamed: client-side TTFT per request (concurrent requests
        cannot read theirs from vLLM's histogram). StackFailed when vLLM does not answer."""
        body = {
            "model": str(self.model_dir),
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream": True,
        }
        rid = new_request_id()
        ids: list[int] = []
        first = 0.0
        try:
            with client_request(rid) as (headers, span):
                req = urllib.request.Request(
                    f"{self.vllm_url}/v1/completions", data=json.dumps(body).encode(),
                    method="POST", headers=headers,
                )  # fmt: skip
                req.add_header("Content-Type", "application/json")
                sent, sent_ns = time.monotonic(), time.time_ns()
                with (
                    maybe_inside(self.ns),
                    urllib.request.urlopen(req, timeout=self.spec.vllm.request_timeout_s) as resp,
                ):
                    for raw in resp:
                        line = raw.decode().strip()
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        choice = (json.loads(line[5:]).get("choices") or [{}])[0]
                        got = choice.get("token_ids") or []
                        if got and not first:
                            first = time.monotonic()
                            first_token(span, rid, sent_ns, time.time_ns())
                        ids.extend(int(t) for t in got)
        except OSError as exc:
            raise StackFailed(f"vLLM streamed request failed ({exc})") from None
        return Streamed(tuple(ids), sent, first or time.monotonic(), time.monotonic(), rid)

    def forget_local(self, wait_s: float = MQ_TIMEOUT_S) -> None:
        """Make vLLM forget its local prefix cache (not the external one). vLLM answers a
        request before the connector has saved its KV and keeps the blocks until then, and
        refuses the reset while any block is held: ask again until wait_s has passed (the
        connector gives up on a save after MQ_TIMEOUT_S)."""
        deadline = time.monotonic() + wait_s
        while True:
            resp = self._http("POST", f"{self.vllm_url}/reset_prefix_cache")
            if not (isinstance(resp, dict) and resp.get("success") is False):
                return
            if time.monotonic() >= deadline:
                raise StackFailed(
                    f"vLLM refused /reset_prefix_cache for {wait_s:.0f} s (blocks still held: "
                    "a request running, or a KV save that never finished)"
                )
            time.sleep(0.2)

    def clear_l1(self) -> None:
        """Empty LMCache's L1 so the next load must come from L2."""
        self._http("POST", f"{self.lmcache_http}/cache/clear", {"tier": "l1", "force": True})

    def tier_reads(self) -> dict[str, int]:
        """Keys each L2 tier has served at load since the server started (its own counter)."""
        out: dict[str, int] = {}
        for adapter in self.lmcache_status()["storage_manager"].get("l2_adapters", []):
            fault = adapter.get("bsr_fault")
            if fault:
                out[fault["name"]] = int(fault.get("load_hit_keys", 0))
        return out

    def lmcache_status(self) -> dict[str, Any]:
        return self._http("GET", f"{self.lmcache_http}/status")


NOT_REPORTED = (
    "vLLM reported no usage.prompt_tokens_details.cached_tokens (start it with "
    "--enable-prompt-tokens-details)"
)


def reported_cached_tokens(usage: dict[str, Any]) -> int | None:
    """vLLM's cached-token count, None when it reports none: vLLM 0.32 sets
    prompt_tokens_details only with --enable-prompt-tokens-details
    (vllm/entrypoints/openai/completion/serving.py:608-615)."""
    value = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return None if value is None else int(value)


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def _ttft_s(after: dict[str, float], before: dict[str, float], fallback_s: float) -> float:
    """vLLM's own TTFT of the one request between two metric reads (requests are sent one
    at a time); the request's wall time when the histogram did not move exactly once."""
    hist = "vllm:time_to_first_token_seconds"
    if _delta(after, before, f"{hist}_count") != 1:
        return fallback_s
    return _delta(after, before, f"{hist}_sum")
