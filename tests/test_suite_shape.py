"""The suite's own shape: a fixture scoped to a package only ends with that package when the
folder IS one. Without ``__init__.py`` pytest gives ``scope="package"`` no package and the
fixture lives to the end of the session: the attach tests' operator deployment (vLLM +
LMCache, ~4 GB resident) then ran under every e2e module that followed it."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE_SCOPE = re.compile(r"""scope\s*=\s*["']package["']""")


def test_every_package_scoped_fixture_lives_in_a_package() -> None:
    here = Path(__file__).resolve()
    scoped = [p for p in TESTS.rglob("*.py") if p != here and PACKAGE_SCOPE.search(p.read_text())]
    assert TESTS / "attach" / "conftest.py" in scoped  # the operator deployment
    orphans = [str(p.relative_to(TESTS)) for p in scoped if not (p.parent / "__init__.py").exists()]
    assert orphans == [], f"add __init__.py beside {orphans}: else the fixture is session-long"


def _suite_conftest():
    import importlib.util

    spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_exclusive_and_grouped_path_exists() -> None:
    """A renamed module must not silently lose its /dev/shm lock or its xdist group."""
    conf = _suite_conftest()
    root = TESTS.parent
    paths = [p.split("::")[0] for p in (*conf.EXCLUSIVE, *conf.GROUPS)]
    assert [p for p in paths if not (root / p).exists()] == []
    assert conf.GROUPS["tests/e2e/test_roundtrip_two_hosts.py"] == "two-hosts"
    assert conf.GROUPS["tests/failmatrix/test_e2e_two_hosts.py"] == "two-hosts"


def test_every_module_that_diffs_all_of_dev_shm_runs_alone() -> None:
    """A test module that lists the whole /dev/shm (the round trip's demo,
    `stack up/down`, the SIGKILLed serving sweep) is in EXCLUSIVE: under `make test` another
    stack's segments would show up in its diff, or its teardown would take this one's."""
    conf = _suite_conftest()
    diffing = sorted(
        str(p.relative_to(TESTS.parent))
        for p in TESTS.rglob("test_*.py")
        if re.search(r"shm_segments\(\)|os\.listdir\(\"/dev/shm\"\)", p.read_text())
        and "mark.e2e" in p.read_text()
    )
    covered = [d for d in diffing if any(e.startswith(d) for e in conf.EXCLUSIVE)]
    assert diffing == [
        "tests/e2e/test_roundtrip.py",
        "tests/e2e/test_stack_cli.py",
        "tests/experiments/restore/test_e2e_serving_killed.py",
    ]
    assert covered == diffing
    # the operator's teardown counts and removes only the segments its own processes made
    assert not any(e.startswith("tests/attach/") for e in conf.EXCLUSIVE)
