"""Every pass checks its bytes, and every tier verifies what it is configured to: sweeps on
the real storage stack (small geometry, seconds) whose L2 objects are corrupted after the
accuracy pass as a user would (one byte flipped mid-file, checksum sidecars untouched).

- stock FS adapter (load_concurrency 1): no checksum ("tier integrity: none"); the timed
  pass installs the bad bytes and its after-timer byte check FAILs the point, naming the
  pass and the objects;
- bsr_fs with ``restore.checksum`` on (load_concurrency 4): the adapter verifies the
  sidecars seeded beside the files, refuses the objects at load (a miss) and the restore
  fails closed; the point FAILs naming the pass and the objects the tier refused;
- bsr_fs with the checksum off: the after-timer byte check catches it, as on the stock path.

And the byte check's time never enters a sample (a counting clock, no wall time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lmcache")

from bsrctl.evidence import Verdict, load_evidence  # noqa: E402
from bsrctl.experiments.restore.sweep import run_sweep  # noqa: E402
from bsrctl.stack.storage import PoolDestination, StorageStack  # noqa: E402
from bsrctl.stack.storage import target as storage_target  # noqa: E402

C = 262_144
BAD_CHUNKS = (1, 5)  # objects corrupted: chunk 1 is in every prefix, chunk 5 from 2048 on
WHY = "storage stack has no model: canonical_output replaced by byte verification; "


def _spec(small_spec, restore: str = "", repeats: int = 1) -> Path:
    p = small_spec()
    text = p.read_text()
    text = text.replace("  window_timeout_s: 20\n", f"  window_timeout_s: 20\n{restore}")
    text = text.replace("  repeats: 1  #", f"  repeats: {repeats}\n  warmup: 0  #")
    p.write_text(text)
    return p


def _doc(out: Path) -> dict[str, Any]:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return load_evidence(run / "evidence.json")


def _flip_mid_file(path: Path) -> None:
    """One byte flipped in the middle of the file, in place (its sidecar untouched)."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def _corrupt_after_accuracy(monkeypatch) -> dict[str, Any]:
    """Before the first timed pass, flip a byte mid-file in the objects of BAD_CHUNKS; what
    was corrupted and the sidecars as they were then."""
    real = storage_target.StorageTarget.measure
    done: dict[str, Any] = {}

    def measure(self, prompt, window_chunks, cold=True, oracle=True):  # noqa: ANN001, ANN202
        if not oracle and not done:
            st = self.stack
            st.seed(4096, prompt.salt)  # the largest prefix's hashes name every object
            names = [st.object_name(0, 0, c) for c in BAD_CHUNKS]
            for name in names:
                _flip_mid_file(st.l2_dir / name)
            files = sorted(st.l2_dir.iterdir())
            sidecars = {p.name: p.read_bytes() for p in files if p.suffix != ".data"}
            data = [p.name for p in files if p.suffix == ".data"]
            done.update(names=names, sidecars=sidecars, data=data, l2_dir=st.l2_dir)
        return real(self, prompt, window_chunks, cold, oracle)

    monkeypatch.setattr(storage_target.StorageTarget, "measure", measure)
    return done


def _canonical(point: dict[str, Any]) -> dict[str, str]:
    return next(c for c in point["checks"] if c["name"] == "canonical_bytes")


@pytest.mark.parametrize(
    ("restore", "adapter", "integrity"),
    [
        ("", "stock", "none"),  # the shipped spec: load_concurrency 1, LMCache's FS adapter
        ("  load_concurrency: 4\n  checksum: false\n", "bsr_fs", "none"),
    ],
    ids=["stock", "bsr_fs-no-checksum"],
)
def test_corrupted_objects_fail_the_timed_pass_by_its_after_timer_byte_check(
    small_spec, tmp_path: Path, monkeypatch, restore: str, adapter: str, integrity: str
) -> None:
    bad = _corrupt_after_accuracy(monkeypatch)
    out = tmp_path / "out"
    spec = _spec(small_spec, restore)
    assert run_sweep(spec, out, "storage", quiet=True) == Verdict.FAIL
    doc = _doc(out)
    assert (doc["stack"]["l2_adapter"], doc["stack"]["tier_integrity"]) == (adapter, integrity)
    assert bad["sidecars"] == {}  # a tier without checksums: no sidecar written
    for p in doc["points"]:
        n, w = p["params"]["tokens"], p["params"]["window_chunks"]
        names = [x for c, x in zip(BAD_CHUNKS, bad["names"], strict=True) if c < n // 256]
        canon = _canonical(p)
        assert canon == {
            "name": "canonical_bytes",
            "verdict": "FAIL",
            "detail": f"timed pass 1: {WHY}{(n // 256) * C} B installed, compared after the "
            f"timer, {len(names)} object(s) not canonical: {', '.join(names)}",
        }, p["id"]
        assert p["verdict"] == "FAIL"
        ident = next(c for c in p["checks"] if c["name"] == "repeats_identical")
        assert (
            ident["verdict"] == "FAIL"
            and f"verify_mismatches per pass [0, {len(names)}]" in (ident["detail"])
        )
        assert p["timed_bad_objects"] == {
            "timed pass 1": {"mismatched_objects": names, "tier_rejected_objects": []}
        }
        assert p["measures"]["bytes_checked"] == "install"  # the accuracy pass's own
        assert len(p["timed_bytes_check_s"]) == 1 and p["timed_bytes_check_s"][0] > 0
        assert (p["id"], p["measures"]["cached_tokens"]) == (f"n{n}-w{w}", n)
    md = (out / doc["run_id"] / "summary.md").read_text()
    why = {"stock": "LMCache's stock FS adapter keeps no checksum",
           "bsr_fs": "restore.checksum is off"}[adapter]  # fmt: skip
    assert (
        f"- L2 tier integrity: none ({why}); every pass's installed bytes compared with the "
        "canonical bytes (timed passes: after their timer).\n"
    ) in md


def test_checksum_on_refuses_the_corrupted_objects_at_load_and_fails_closed(
    small_spec, tmp_path: Path, monkeypatch
) -> None:
    bad = _corrupt_after_accuracy(monkeypatch)
    out = tmp_path / "out"
    spec = _spec(small_spec, "  load_concurrency: 4\n")
    assert run_sweep(spec, out, "storage", quiet=True) == Verdict.FAIL
    doc = _doc(out)
    assert (doc["stack"]["l2_adapter"], doc["stack"]["tier_integrity"]) == ("bsr_fs", "xxh3_128")
    # every object was seeded with the sidecar the adapter verifies; none was touched
    assert len(bad["data"]) == 16
    assert sorted(bad["sidecars"]) == [f"{n}.xxh3_128" for n in bad["data"]]
    for p in doc["points"]:
        n, w = p["params"]["tokens"], p["params"]["window_chunks"]
        names = [x for c, x in zip(BAD_CHUNKS, bad["names"], strict=True) if c < n // 256]
        # fail closed: W > 0 stops at the window holding chunk 1 (nothing installed); the
        # whole plan's prefix ends before it (chunk 0 installed, canonical)
        refused = names[:1] if w else names
        said = f"the tier refused {len(refused)} object(s) at load as corrupted: "
        said += ", ".join(refused)
        installed = f"0 B restored; {said}" if w else (
            f"{C} B installed, compared after the timer, 0 object(s) not canonical; {said}"
        )  # fmt: skip
        assert _canonical(p) == {
            "name": "canonical_bytes",
            "verdict": "FAIL",
            "detail": f"timed pass 1: {WHY}{installed}",
        }, p["id"]
        assert p["timed_bad_objects"] == {
            "timed pass 1": {"mismatched_objects": [], "tier_rejected_objects": refused}
        }
        tokens = next(c for c in p["checks"] if c["name"] == "cached_token_accounting")
        assert tokens == {
            "name": "cached_token_accounting",
            "verdict": "FAIL",
            "detail": f"timed pass 1: cached {0 if w else 256}, expected {n}",
        }
        assert p["verdict"] == "FAIL"
    md = (out / doc["run_id"] / "summary.md").read_text()
    assert "- L2 tier integrity: xxh3_128 checksum sidecars, verified at load" in md


def test_the_byte_check_s_time_never_enters_a_sample(
    small_spec, tmp_path: Path, monkeypatch
) -> None:
    # A counting clock: each read of it one second later; the byte check a thousand.
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    real = PoolDestination.compare_pool

    def slow_compare(self: PoolDestination) -> None:
        now[0] += 1000.0
        real(self)

    monkeypatch.setattr(StorageStack, "clock", staticmethod(clock))
    monkeypatch.setattr(PoolDestination, "compare_pool", slow_compare)
    out = tmp_path / "out"
    assert run_sweep(_spec(small_spec, repeats=3), out, "storage", quiet=True) == Verdict.PASS
    for p in _doc(out)["points"]:
        # t0, t1 (probe done), t2 (restore done): 2 s; the check after t2 costs 1001 s apart
        assert p["samples"] == {
            "restore_s": [2.0] * 3,
            "probe_s": [1.0] * 3,
            "retrieve_s": [1.0] * 3,
        }
        assert p["timed_bytes_check_s"] == [1001.0] * 3
        assert "timed_bad_objects" not in p
        assert p["accuracy_pass"] == {"restore_s": 2.0, "probe_s": 1.0, "retrieve_s": 1.0}
        assert p["measures"]["bytes_check_s"] is None  # compared while installing
        assert _canonical(p)["detail"].endswith(
            "compared while installing, 0 object(s) not canonical"
        )
