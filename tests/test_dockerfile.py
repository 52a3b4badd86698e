"""The Dockerfile the fleet's manifests and the nightly name: a CUDA 13 base (lmcache
0.5.6's CUDA), exactly the pinned `gpu` extra installed (nothing else, nothing pinned
beside it), bsrctl as the entry point, the spec paths the Jobs use in its work folder."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

from bsrctl.fleet.manifests import WORKDIR

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", TEXT)
    lines = [s.strip() for s in joined.splitlines() if s.strip() and not s.startswith("#")]
    return [(s.split(None, 1)[0], s.split(None, 1)[1]) for s in lines]


def pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` in a RUN (options dropped)."""
    out = []
    for op, arg in instructions():
        if op != "RUN":
            continue
        for cmd in re.split(r"&&|;", arg):
            words = shlex.split(cmd)
            if words[:2] == ["pip", "install"] or words[1:4] == ["-m", "pip", "install"]:
                start = words.index("install") + 1
                out.append([w for w in words[start:] if not w.startswith("-")])
    return out


def test_it_installs_exactly_the_gpu_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # the mechanisms and the project with its gpu extra, nothing else
    assert pip_installs() == [["./mechanisms", ".[gpu]"]]
    pins = {re.split(r"[=<>]", p)[0] for p in extras["gpu"]}
    assert pins == {"vllm", "lmcache", "mooncake-transfer-engine-cuda13"}
    body = " ".join(a for _, a in instructions()).lower()
    for name in pins | {"torch"}:  # no package of the extra installed or pinned apart
        assert name not in body, name


def test_cuda_13_base_entry_point_and_work_folder() -> None:
    ops = instructions()
    (base,) = [a for op, a in ops if op == "FROM"]
    assert re.fullmatch(r"nvidia/cuda:13\.\d+\.\d+-\w+-ubuntu\d+\.\d+", base), base
    assert ("ENTRYPOINT", '["bsrctl"]') in ops
    assert ("WORKDIR", WORKDIR) in ops  # the Jobs' workingDir
    assert ("COPY", "ladders ./ladders") in ops
    assert ("COPY", "mechanisms ./mechanisms") in ops
    run = " ".join(a for op, a in ops if op == "RUN")
    assert "python3.11" in run and all(t in run for t in ("iproute2", "util-linux"))
