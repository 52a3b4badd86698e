"""The soak spec: the shipped one loads; a fault that cannot repeat, a prefix too long or too
short, a bad cell and a bad duration are exit-2 input naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bsrctl.errors import BadInput
from bsrctl.experiments.soak.run import run_soak
from bsrctl.experiments.soak.spec import SOAK_FAULTS, load_soak

SHIPPED = Path(__file__).parents[3] / "matrices" / "soak-cpu.yaml"


def test_the_shipped_soak_draws_from_every_repeatable_fault() -> None:
    spec, _ = load_soak(SHIPPED)
    assert {c.fault for c in spec.cells} == set(SOAK_FAULTS)
    assert spec.soak.prefix_tokens == [2048, 2048, 3072, 3072, 4000, 4000]
    assert spec.windows() == 2  # 2048 tokens = 8 chunks, W = 4
    assert spec.settings().budget_chunks == 4
    # the failure matrix's deployment: the soak can share it
    from bsrctl.experiments.failmatrix import load_matrix

    matrix, _ = load_matrix(SHIPPED.with_name("cpu.yaml"))
    assert spec.stack == matrix.stack and spec.settings() == matrix.settings()


def write(tmp_path: Path, **change) -> Path:
    doc = yaml.safe_load(SHIPPED.read_text())
    for dotted, value in change.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[int(leaf) if leaf.isdigit() else leaf] = value
    path = tmp_path / "soak.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"cells__0__fault": "lmcache_killed"}, "cannot repeat on one deployment"),
        ({"soak__prefix_tokens": [2048, 3072, 11000]}, "exceeds stack.vllm.max_model_len 10240"),
        ({"soak__prefix_tokens": [200, 2048, 3072]}, "more than one chunk of 256 tokens"),
        ({"soak__prefix_tokens": []}, "soak.prefix_tokens"),
        ({"soak__concurrency": 0}, "soak.concurrency"),
        ({"soak__concurrency": 7}, "soak.concurrency: 7 requests per round need as many"),
        ({"soak__colour": "red"}, "soak.colour: unknown field"),
        ({"cells__4__delay_s": 2}, "must exceed restore.window_timeout_s"),
    ],
)
def test_bad_specs_are_bad_input(tmp_path: Path, change: dict, needle: str) -> None:
    with pytest.raises(BadInput, match=needle):
        load_soak(write(tmp_path, **change))


def test_a_window_beyond_the_smallest_prefix_is_refused(tmp_path: Path) -> None:
    cells = [{"id": "w", "fault": "window_timeout", "window": 2, "expect": "recompute"}]
    why = r"window 2 out of range .*; use 0\.\.1 \(at the smallest prefix\)$"
    with pytest.raises(BadInput, match=why):
        load_soak(write(tmp_path, cells=cells))


def test_a_duration_that_is_not_positive_is_refused_before_anything(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"--duration: 0 s; give a positive number"):
        run_soak(SHIPPED, tmp_path / "out", 1, 0.0)
    assert not (tmp_path / "out").exists()
