"""A fake attached deployment on one loopback HTTP port: vLLM's routes (/health, /v1/models,
/v1/completions, /reset_prefix_cache) and LMCache's (/healthcheck, /status), with recorded
answers an operator's servers give when a prerequisite is missing. The same port takes the
MP server's TCP connection test."""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# LMCache 0.5.6's /status of a server with the BSR module, lmcache_driven transfer and one
# registered vLLM instance (the keys prerequisites read; the rest trimmed)
STATUS_OK: dict[str, Any] = {
    "is_healthy": True,
    "engine_type": "MPCacheEngine",
    "chunk_size": 256,
    "storage_manager": {"l2_adapters": [{"type": "FSL2Adapter", "base_path": "/l2"}]},
    "registered_gpu_ids": [7],
    "cache_context_meta": {"7": {"model_name": "m", "world_size": 1}},
    "bsr": {"config": {"window_chunks": 0}},
}
# vLLM 0.32's usage with --enable-prompt-tokens-details (a 3-token probe, nothing cached)
USAGE_OK = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


@dataclass
class Answers:
    """What the fake answers; each field one prerequisite's evidence."""

    reset_route: int = 405  # GET /reset_prefix_cache: 405 with VLLM_SERVER_DEV_MODE=1, 404 not
    usage: dict[str, Any] = field(default_factory=lambda: dict(USAGE_OK))
    status: dict[str, Any] = field(default_factory=lambda: json.loads(json.dumps(STATUS_OK)))
    seen: list[str] = field(default_factory=list)  # "METHOD path" of every request


def _handler(ans: Answers) -> type[http.server.BaseHTTPRequestHandler]:
    class Fake(http.server.BaseHTTPRequestHandler):
        def _send(self, code: int, doc: Any) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            ans.seen.append(f"GET {self.path}")
            routes = {
                "/health": (200, {}),
                "/healthcheck": (200, {"status": "healthy"}),
                "/status": (200, ans.status),
                "/v1/models": (200, {"data": [{"id": "m", "max_model_len": 4096}]}),
                "/version": (200, {"version": "0.32.0"}),
            }
            if self.path == "/reset_prefix_cache":
                detail = "Method Not Allowed" if ans.reset_route == 405 else "Not Found"
                self._send(ans.reset_route, {"detail": detail})
            else:
                self._send(*routes.get(self.path, (404, {"detail": "Not Found"})))

        def do_POST(self) -> None:  # noqa: N802
            ans.seen.append(f"POST {self.path}")
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path == "/v1/completions":
                self._send(200, {"choices": [{"text": "x", "token_ids": [5]}], "usage": ans.usage})
            else:
                self._send(404, {"detail": "Not Found"})

        def log_message(self, *_a: object) -> None:
            pass

    return Fake


@contextmanager
def fake_deployment(ans: Answers) -> Iterator[int]:
    """The port of a fake vLLM + LMCache answering `ans`."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(ans))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    before = os.environ.get(FAKE_TOKEN_ENV)
    os.environ[FAKE_TOKEN_ENV] = "fake-token"  # bsrctl has a token to send
    try:
        yield int(srv.server_address[1])
    finally:
        if before is None:
            os.environ.pop(FAKE_TOKEN_ENV, None)
        else:
            os.environ[FAKE_TOKEN_ENV] = before
        srv.shutdown()
        srv.server_close()


FAKE_TOKEN_ENV = "BSRCTL_FAKE_CONTROL_TOKEN"  # set by fake_deployment while it runs


def attach_section(port: int, token_env: str | None = FAKE_TOKEN_ENV) -> str:
    return (
        f"  attach:\n    vllm_url: http://127.0.0.1:{port}\n"
        f"    lmcache_url: tcp://127.0.0.1:{port}\n    lmcache_http_port: {port}\n"
        "    connect_timeout_s: 2\n"
        + (f"    control_token_env: {token_env}\n" if token_env else "")
    )
