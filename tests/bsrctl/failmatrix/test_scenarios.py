"""The checks of the failure cells of more than one request (``failmatrix.scenarios``), over
recorded rows: exact verdicts and details, including deliberately broken records."""

from __future__ import annotations

from typing import Any

from bsrctl.experiments.failmatrix.scenarios import concurrent_checks

OK = {"ok": True, "failure": None}


def row(name: str, tokens: int, **over: Any) -> dict[str, Any]:
    full = tokens // 256 * 256
    base = {
        "prompt": name,
        "tokens": tokens,
        "finished": True,
        "error": "",
        "cached_tokens": full,
        "full_tokens": full,
        "canonical": True,
        "restores": [OK],
    }
    return {**base, **over}


def run(rows: list[dict[str, Any]], peak: int = 1 << 20, budget_peak: int = 4) -> dict[str, Any]:
    checks = concurrent_checks(rows, peak, 1 << 20, budget_peak, 4, True, "healthy", [],
                               {"vllm": True, "lmcache": True}, 30.0, 240.0)  # fmt: skip
    return {c.name: (c.verdict.value, c.detail) for c in checks}


def test_sixteen_restored_canonical_within_the_bound_pass() -> None:
    rows = [row(f"c/r{i}", [1024, 2048, 3072, 4000][i % 4]) for i in range(16)]
    got = run(rows)
    assert got == {
        "all_answered": ("PASS", "16 of 16 answered within the bound"),
        "canonical_output": ("PASS", "16 of 16 canonical"),
        "every_prefix_restored": ("PASS", "16 of 16 restored their full prefix"),
        "pool_bound": (
            "PASS",
            "pool peak 1048576 B over all 16, bound B x c + aux = 1048576 B;"
            " budget peak 4 of B = 4 chunks",
        ),  # fmt: skip
        "post_request_health": ("PASS", "healthy"),
        "bounded_time": ("PASS", "cell 30.0 s, bound 240 s"),
        "processes_accounted": ("PASS", "stopped/replaced PIDs still alive []; parts down []"),
    }


def test_a_partial_prefix_a_wrong_output_and_a_hung_request_each_fail_by_name() -> None:
    rows = [
        row("c/r0", 1024),
        row("c/r1", 2048, cached_tokens=1024, restores=[{"ok": False, "failure": "TIMEOUT"}]),
        row("c/r2", 3072, canonical=False),
        row("c/r3", 4000, finished=False, cached_tokens=None, canonical=False, restores=[]),
    ]
    got = run(rows)
    assert got["all_answered"] == ("FAIL", "3 of 4 answered within the bound; hung ['c/r3']")
    assert got["canonical_output"] == ("FAIL", "2 of 4 canonical; wrong ['c/r2']")
    assert got["every_prefix_restored"] == (
        "FAIL",
        "2 of 4 restored their full prefix; not full: ['c/r1 cached 1024 of 2048', "
        "'c/r3 cached None of 3840']; failed restores: ['c/r1: TIMEOUT']",
    )
    assert got["bounded_time"][0] == "FAIL"


def test_a_pool_peak_one_byte_over_b_c_plus_aux_fails() -> None:
    rows = [row("c/r0", 1024), row("c/r1", 2048)]
    assert run(rows, peak=(1 << 20) + 1)["pool_bound"][0] == "FAIL"
    assert run(rows, budget_peak=5)["pool_bound"][0] == "FAIL"
    assert run(rows)["pool_bound"][0] == "PASS"
