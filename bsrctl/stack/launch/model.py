"""The model a serving deployment serves: the one home of model preparation (folder,
vocabulary) for every serving experiment (restore targets, the failure matrix, the round
trip, TempoKV) and for the stack that launches vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bsrctl.errors import StackFailed
from bsrctl.specs import VllmSpec
from bsrctl.stack.launch import tinymodel


@dataclass(frozen=True)
class PreparedModel:
    """The model folder vLLM loads, its vocabulary (prompts draw ids below it) and the sha256
    of its files ('' when it has no manifest: not content-addressed, never cached)."""

    folder: Path
    vocab: int
    sha256: str


def model_folder(vllm: VllmSpec) -> Path:
    """The folder vLLM loads, without building or reading it (``stack plan``)."""
    return tinymodel.folder() if vllm.model == "tiny" else Path(vllm.model)


def prepare_model(vllm: VllmSpec) -> PreparedModel:
    """Build the tiny model (once, content-addressed) or check the user's folder."""
    if vllm.model == "tiny":
        folder = tinymodel.build()
    else:
        folder = model_folder(vllm)
        if not (folder / "config.json").is_file():
            raise StackFailed(
                f"stack.vllm.model: {folder} has no config.json; give a local model folder or "
                "'tiny'"
            )
    sha = tinymodel.model_sha256(folder) if tinymodel.has_manifest(folder) else ""
    return PreparedModel(folder, tinymodel.vocab_size(folder), sha)
