"""Each run's VLLM_CACHE_ROOT is its own, but vLLM's model-class inspection cache
(``modelinfos/``) is one folder under the bsrctl cache home, so a vLLM start skips the
inspecting interpreter after the first."""

from __future__ import annotations

from pathlib import Path

import pytest

from bsrctl.stack.launch.serving.vllm_cache import shared_modelinfos, vllm_cache_root


def test_every_run_links_the_one_modelinfos_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BSRCTL_CACHE", str(tmp_path / "home"))
    assert shared_modelinfos() == tmp_path / "home" / "vllm-modelinfos"
    a = vllm_cache_root(tmp_path / "run-a" / "vllm-cache")
    b = vllm_cache_root(tmp_path / "run-b" / "vllm-cache")
    assert (a, b) == (tmp_path / "run-a" / "vllm-cache", tmp_path / "run-b" / "vllm-cache")
    (a / "modelinfos" / "x.json").write_text("{}")  # what vLLM writes in one run
    assert (b / "modelinfos" / "x.json").read_text() == "{}"  # the next one reads
    assert sorted(p.name for p in (tmp_path / "home" / "vllm-modelinfos").iterdir()) == ["x.json"]
    assert vllm_cache_root(a) == a  # again (a restart): the link is kept
    assert (a / "modelinfos").resolve() == shared_modelinfos().resolve()
    assert sorted(p.name for p in a.iterdir()) == ["modelinfos"]
