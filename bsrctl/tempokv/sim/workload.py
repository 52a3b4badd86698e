"""Requests for the simulated engine: the paper's 12-document workload, Poisson arrivals
over a document pool, or a replayed trace. Everything drawn is seeded."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bsrkv.tempokv.kv import Manifest, prefix_manifest


@dataclass(frozen=True, slots=True)
class Request:
    req_id: str
    arrival_s: float  # submission to the engine
    hit_s: float  # when the runtime reports the reusable-KV hit (≤ arrival_s)
    doc_id: str
    prompt_tokens: int
    cached_tokens: int  # in complete chunks; the question and any partial chunk are not
    output_tokens: int  # this request's true output length (the engine knows, TTU does not)
    manifest: Manifest


@dataclass(frozen=True, slots=True)
class OutputLengths:
    max_tokens: int = 128  # generation limit
    eos_fraction: float = 0.2  # share of requests ending early on EOS
    min_tokens: int = 16

    def draw(self, rng: random.Random) -> int:
        if rng.random() < self.eos_fraction:
            return rng.randrange(self.min_tokens, self.max_tokens)
        return self.max_tokens


def cached_tokens(doc_tokens: int, ratio: float, chunk_tokens: int) -> int:
    """A nominal prefix ratio of the document, kept in complete chunks only."""
    return int(doc_tokens * ratio) // chunk_tokens * chunk_tokens


@lru_cache(maxsize=4096)
def _manifest(doc: str, cached: int, chunk_tokens: int, kv_bytes_per_token: int) -> Manifest:
    """Requests for the same document share one manifest (and its objects)."""
    return prefix_manifest(doc, cached, chunk_tokens, kv_bytes_per_token)


def _request(
    i: int,
    arrival_s: float,
    doc: str,
    doc_tokens: int,
    question_tokens: int,
    ratio: float,
    output_tokens: int,
    chunk_tokens: int,
    kv_bytes_per_token: int,
    hit_lead_s: float = 0.0,
) -> Request:
    cached = cached_tokens(doc_tokens, ratio, chunk_tokens)
    return Request(
        req_id=f"r{i:05d}",
        arrival_s=arrival_s,
        hit_s=arrival_s - hit_lead_s,
        doc_id=doc,
        prompt_tokens=doc_tokens + question_tokens,
        cached_tokens=cached,
        output_tokens=output_tokens,
        manifest=_manifest(doc, cached, chunk_tokens, kv_bytes_per_token),
    )


def fixed_interval(
    docs_tokens: list[int],
    interval_s: float,
    ratio: float,
    question_tokens: int,
    outputs: OutputLengths,
    seed: int,
    chunk_tokens: int,
    kv_bytes_per_token: int,
) -> list[Request]:
    """The paper's workload: document i arrives at i·interval, one question each."""
    rng = random.Random(seed)
    return [
        _request(
            i,
            i * interval_s,
            f"doc{i}",
            n,
            question_tokens,
            ratio,
            outputs.draw(rng),
            chunk_tokens,
            kv_bytes_per_token,
        )
        for i, n in enumerate(docs_tokens)
    ]


def poisson(
    docs_tokens: list[int],
    rate_rps: float,
    num_requests: int,
    ratio: float,
    question_tokens: int,
    outputs: OutputLengths,
    seed: int,
    chunk_tokens: int,
    kv_bytes_per_token: int,
) -> list[Request]:
    """Poisson arrivals; each request picks a document of the pool uniformly, so documents
    (and their KV objects) are shared between requests."""
    rng = random.Random(seed)
    t_s = 0.0
    out = []
    for i in range(num_requests):
        d = rng.randrange(len(docs_tokens))
        out.append(
            _request(
                i,
                t_s,
                f"doc{d}",
                docs_tokens[d],
                question_tokens,
                ratio,
                outputs.draw(rng),
                chunk_tokens,
                kv_bytes_per_token,
            )
        )
        t_s += rng.expovariate(rate_rps)
    return out


def replay(
    path: Path,
    ratio: float,
    outputs: OutputLengths,
    seed: int,
    chunk_tokens: int,
    kv_bytes_per_token: int,
) -> list[Request]:
    """JSON lines: {"arrival_s", "doc", "prompt_tokens"[, "question_tokens", "output_tokens"]}."""
    rng = random.Random(seed)
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        question = int(row.get("question_tokens", 0))
        out_tokens = int(row.get("output_tokens") or outputs.draw(rng))
        out.append(
            _request(
                i,
                float(row["arrival_s"]),
                str(row["doc"]),
                int(row["prompt_tokens"]) - question,
                question,
                ratio,
                min(out_tokens, outputs.max_tokens),
                chunk_tokens,
                kv_bytes_per_token,
            )
        )
    return sorted(out, key=lambda r: (r.arrival_s, r.req_id))
