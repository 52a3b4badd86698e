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
