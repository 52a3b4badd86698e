"""The stack spec's ``trace`` field: per-request timelines on OpenTelemetry."""

from __future__ import annotations

from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, field_validator


class TraceSpec(BaseModel):
    """``enabled``: collect every process's spans into the run folder (spans.jsonl,
    timeline.json). ``forward_endpoint``: also send them, as received, to this OTLP/HTTP
    traces endpoint (a Jaeger or Tempo collector: ``http://host:4318/v1/traces``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    forward_endpoint: str | None = None

    @field_validator("forward_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        url = urlparse(value)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(
                f"{value!r} is not an OTLP/HTTP URL: give e.g. http://127.0.0.1:4318/v1/traces"
            )
        return value
