"""The output oracle's pure parts: the install read-back check and measures, the output
check's divergence and stated tolerance, and the batch-invariance decision."""

from __future__ import annotations

import pytest

from bsrctl.errors import BadInput
from bsrctl.evidence import Verdict
from bsrctl.experiments.restore import acceptance as acc
from bsrctl.stack.contracts.readback import SCRATCH_NOTE, readback_measures
from bsrctl.stack.launch.batch_invariance import batch_invariance
from bsrctl.stack.measure.canonical_outputs import Reference, divergence
from bsrkv.lmcache_ext.bsr.protocol import ReadbackTotals, RestoreOutcomeSummary

from .test_acceptance import SHA_A, SHA_B, serving_measures, verdicts

RB = {"windows_checked": 4, "chunks_checked": 4, "mismatches": 0, "seconds": 0.01,
      "scratch_bytes": 262144, "enabled": True}  # fmt: skip


def test_a_serving_point_with_read_back_gets_the_install_readback_check_last() -> None:
    checks = acc.judge(serving_measures(readback=RB, windows_done=4))
    assert [c.name for c in checks][-2:] == ["bounded_restore", "install_readback"]
    (c,) = [c for c in checks if c.name == "install_readback"]
    assert (c.verdict, c.detail) == (
        Verdict.PASS,
        "4 of 4 window(s) read back, 4 object(s) compared, 0 mismatch(es), 0.01 s, scratch "
        "262144 B (not in W*c + aux)",
    )
    # off in an operator's module, W = 0, or evidence from before: no such check
    for m in (
        serving_measures(readback={**RB, "enabled": False}, windows_done=4),
        serving_measures(readback=RB, window_chunks=0),
        serving_measures(),
    ):
        assert "install_readback" not in verdicts(m)


@pytest.mark.parametrize(
    ("rb", "windows", "verdict"),
    [
        ({**RB, "mismatches": 1}, 4, Verdict.FAIL),
        ({**RB, "windows_checked": 3}, 4, Verdict.FAIL),  # a window installed, not read back
        ({**RB, "windows_checked": 0, "chunks_checked": 0}, 0, Verdict.UNKNOWN),
        (RB, None, Verdict.UNKNOWN),
    ],
)
def test_install_readback_fails_on_a_mismatch_or_a_window_not_checked(rb, windows, verdict) -> None:
    assert acc.install_readback(rb, windows).verdict == verdict


def _outcome(rank: int, windows: int, mismatches: int = 0) -> RestoreOutcomeSummary:
    return RestoreOutcomeSummary(
        request_id="r", rank=rank, mode="bsr", ok=True, start_token=0, end_token=1024,
        restore_s=0.1, failure="NONE", detail="", cached_chunks=4, windows_done=windows,
        bytes_restored=4, peak_staged_bytes_by_rank={rank: 2},
        window_phases=tuple({"install_s": 0.002, "sync_s": 0.0005} for _ in range(windows)),
        readback=ReadbackTotals(windows, 2 * windows, 0, mismatches, 0.001 * windows, 512),
    )  # fmt: skip


def test_readback_measures_sum_the_ranks_and_put_the_install_time_beside() -> None:
    m = readback_measures([_outcome(0, 2), _outcome(1, 2, mismatches=1)], True)
    assert m == {
        "enabled": True,
        "path": "bsr windows",
        "windows_checked": 4,
        "chunks_checked": 8,
        "chunks_unchecked": 0,
        "mismatches": 1,
        "seconds": 0.004,
        "seconds_per_window": 0.001,
        "install_seconds": 0.01,
        "install_seconds_per_window": 0.0025,
        "scratch_bytes": 512,
        "scratch_in_aux": False,
        "scratch_note": SCRATCH_NOTE,
    }
    stock = readback_measures([], True)
    assert (stock["path"], stock["windows_checked"], stock["seconds_per_window"]) == (
        "stock whole-plan retrieve: not read back", 0, None,
    )  # fmt: skip


def test_the_readback_totals_round_trip_on_the_wire() -> None:
    o = _outcome(0, 2)
    wire = o.to_json()
    assert wire["readback"] == {
        "windows_checked": 2, "chunks_checked": 4, "chunks_unchecked": 0, "mismatches": 0,
        "seconds": 0.002, "scratch_bytes": 512,
    }  # fmt: skip
    assert RestoreOutcomeSummary.from_json(wire) == o
    del wire["readback"]  # a module without read-back sends none: still a valid reply
    assert RestoreOutcomeSummary.from_json(wire).readback is None


def test_divergence_is_the_first_differing_token_and_the_gap_before_it() -> None:
    ref = Reference((5, 6, 7, 8), (-0.5, -1.0, -0.25, -2.0))
    assert divergence((5, 6, 7, 8), (-0.5, -1.0, -0.25, -2.0), ref) == (None, 0.0)
    assert divergence((5, 6, 9, 8), (-0.5, -1.125, -3.0, -2.0), ref) == (2, 0.125)
    assert divergence((5, 6, 7), None, ref) == (3, None)  # shorter: diverges where it ends
    assert divergence((5,), None, None) == (None, None)


def test_cpu_stays_bit_exact_and_a_tolerance_is_only_what_a_spec_states() -> None:
    exact = acc.canonical_output(SHA_A, SHA_A, None, 0.0)
    assert (exact.verdict, exact.detail) == (
        Verdict.PASS,
        f"{SHA_A[:16]} vs {SHA_A[:16]}: bit-exact tokens, top-1 logprob gap <= 0",
    )
    tol = {"max_logprob_gap": 0.05, "min_identical_tokens": 8}
    strict = acc.canonical_output(SHA_B, SHA_A, 12, 0.01)  # no tolerance stated: FAIL
    assert (strict.verdict, strict.detail) == (
        Verdict.FAIL,
        f"{SHA_B[:16]} vs {SHA_A[:16]}: first divergence at token 12, top-1 logprob gap <= 0.01",
    )
    within = acc.canonical_output(SHA_B, SHA_A, 12, 0.01, tol)
    assert (within.verdict, within.detail) == (
        Verdict.PASS,
        f"{SHA_B[:16]} vs {SHA_A[:16]}: first divergence at token 12, top-1 logprob gap <= "
        "0.01: within the stated tolerance (divergence at >= 8, gap <= 0.05)",
    )
    assert acc.canonical_output(SHA_B, SHA_A, 3, 0.01, tol).verdict == Verdict.FAIL  # too early
    assert acc.canonical_output(SHA_B, SHA_A, 12, 0.5, tol).verdict == Verdict.FAIL  # too far
    assert acc.canonical_output(SHA_B, SHA_A, None, None, tol).verdict == Verdict.FAIL
    m = serving_measures(output_sha256=SHA_B, output_first_divergence=12,
                         output_max_logprob_gap=0.01, output_tolerance=tol)  # fmt: skip
    assert verdicts(m)["canonical_output"] == Verdict.PASS


LLAMA = {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}
DSV4 = {"quantization_config": {"quant_method": "fp8"}, "index_topk": 512}


def test_batch_invariance_is_set_where_vllm_makes_it_hold() -> None:
    on = batch_invariance("cuda", None, "auto", "auto", LLAMA)
    assert (on.on, dict(on.env)) == (True, {"VLLM_BATCH_INVARIANT": "1"})
    assert on.reason == "on by default where it holds: unquantized auto"
    off = batch_invariance("cuda", None, "auto", "auto", DSV4)
    assert (off.on, dict(off.env)) == (False, {})
    assert off.reason == (
        "off: a fp8-quantized checkpoint: quantized linear layers are not covered; declare "
        "vllm.output_tolerance"
    )
    assert "quantized KV" in batch_invariance("cuda", None, "bfloat16", "fp8", LLAMA).reason
    sparse = batch_invariance("cuda", None, "bfloat16", "auto", {"index_topk": 64})
    assert "sparse MLA" in sparse.reason and not sparse.on
    fi = batch_invariance("cuda", None, "bfloat16", "auto", LLAMA, "FLASHINFER")
    assert fi.reason.startswith("off: attention backend FLASHINFER does not declare it")
    assert batch_invariance("cuda", None, "bfloat16", "auto", LLAMA, "TRITON_ATTN").on
    assert batch_invariance("cuda", False, "bfloat16", "auto", LLAMA).env == {}
    cpu = batch_invariance("cpu", None, "float32", "auto", LLAMA)
    assert (cpu.on, dict(cpu.env)) == (False, {})


def test_asking_for_batch_invariance_where_it_cannot_hold_is_refused() -> None:
    with pytest.raises(BadInput, match="needs stack.device: cuda"):
        batch_invariance("cpu", True, "float32", "auto", LLAMA)
    with pytest.raises(BadInput, match="fp8-quantized checkpoint"):
        batch_invariance("cuda", True, "auto", "auto", DSV4)
