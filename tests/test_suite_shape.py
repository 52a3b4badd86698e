"""The suite's own shape: a fixture scoped to a package only ends with that package when the
folder IS one. Without ``__init__.py`` pytest gives ``scope="package"`` no package and the
fixture lives to the end of the session: the attach tests' operator deployment (vLLM +
LMCache, ~4 GB resident) then ran under every e2e module that followed it."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE_SCOPE = re.compile(r"""scope\s*=\s*["']package["']""")


def test_every_package_scoped_fixture_lives_in_a_package() -> None:
    here = Path(__file__).resolve()
    scoped = [p for p in TESTS.rglob("*.py") if p != here and PACKAGE_SCOPE.search(p.read_text())]
    assert TESTS / "e2e" / "attach" / "conftest.py" in scoped  # the operator deployment
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
    paths += [u for u in conf.LONGEST_FIRST if u not in conf.GROUPS.values()]
    assert [p for p in paths if not (root / p).exists()] == []
    assert conf.GROUPS["tests/e2e/test_roundtrip_two_hosts.py"] == "two-hosts"
    assert conf.GROUPS["tests/e2e/failmatrix/test_e2e_two_hosts.py"] == "two-hosts"


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
        "tests/e2e/serving/test_e2e_serving_killed.py",
        "tests/e2e/test_roundtrip.py",
        "tests/e2e/test_stack_cli.py",
    ]
    assert covered == diffing
    # the operator's teardown counts and removes only the segments its own processes made
    assert not any(e.startswith("tests/e2e/attach/") for e in conf.EXCLUSIVE)


# The layout: tests of the mechanisms distribution (tests/bsrkv: they import nothing of the
# harness), of the harness (tests/bsrctl), every e2e module in tests/e2e; only the
# project-wide files at the top (docs/architecture/testing.md).
PROJECT_WIDE = {
    "conftest.py",
    "test_distributions.py",
    "test_dockerfile.py",
    "test_docs.py",
    "test_hypothesis_profile.py",
    "test_layers.py",
    "test_session_leftovers.py",
    "test_sigterm_teardown.py",
    "test_suite_shape.py",
    "test_workflows.py",
}
AREAS = ("bsrkv", "bsrctl", "e2e")


def _marked_e2e(tree: ast.AST) -> bool:
    """``pytest.mark.e2e`` anywhere in the module: ``pytestmark`` or a test's decorator."""
    return any(
        isinstance(n, ast.Attribute) and n.attr == "e2e"
        and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
        for n in ast.walk(tree)
    )  # fmt: skip


def _imports_bsrctl(tree: ast.AST) -> bool:
    """An import of bsrctl or of the harness's tests, at the top or inside a function."""
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    names += [n.module or "" for n in froms]
    return any(m.split(".")[0] == "bsrctl" or m.startswith("tests.bsrctl") for m in names)


def layout_faults(tests: Path) -> list[str]:
    """Every module of the suite (tests/data aside) out of its place, with why."""
    faults = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if rel.parts[0] == "data":
            continue
        area = rel.parts[0] if len(rel.parts) > 1 else None
        if area is None and rel.name not in PROJECT_WIDE:
            faults.append(f"{rel}: not project-wide; move it under tests/{{bsrkv,bsrctl,e2e}}")
            continue
        if area is not None and area not in AREAS:
            faults.append(f"{rel}: under no area; move it under tests/{{bsrkv,bsrctl,e2e}}")
            continue
        tree = ast.parse(path.read_text())
        if rel.name.startswith("test_") and _marked_e2e(tree) != (area == "e2e"):
            where = "marked e2e outside tests/e2e" if area != "e2e" else "unmarked in tests/e2e"
            faults.append(f"{rel}: {where}")
        if area == "bsrkv" and _imports_bsrctl(tree):
            faults.append(f"{rel}: imports bsrctl; tests of bsrkv run without the harness")
    return faults


def test_every_module_is_in_its_place() -> None:
    assert layout_faults(TESTS) == []
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        *AREAS,
        "data",
    }


def test_the_layout_check_breaks_on_each_misplaced_module(tmp_path: Path) -> None:
    """On a copy of the suite, one misplaced module of each kind: each is named, nothing else."""
    copy = tmp_path / "tests"
    shutil.copytree(TESTS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "test_stray.py").write_text("def test_x() -> None: ...\n")
    (copy / "restore").mkdir()
    (copy / "restore" / "test_core.py").write_text("")
    marked = (copy / "e2e" / "test_roundtrip.py").read_text()
    (copy / "bsrctl" / "test_moved_e2e.py").write_text(marked)
    (copy / "e2e" / "test_unmarked.py").write_text("def test_x() -> None: ...\n")
    clock = copy / "bsrkv" / "test_clock.py"
    clock.write_text(clock.read_text() + "\n\ndef f():\n    from bsrctl.stats import mean\n")
    (copy / "bsrkv" / "test_helper.py").write_text("import tests.bsrctl.stack.kept\n")
    assert layout_faults(copy) == [
        "bsrctl/test_moved_e2e.py: marked e2e outside tests/e2e",
        "bsrkv/test_clock.py: imports bsrctl; tests of bsrkv run without the harness",
        "bsrkv/test_helper.py: imports bsrctl; tests of bsrkv run without the harness",
        "e2e/test_unmarked.py: unmarked in tests/e2e",
        "restore/test_core.py: under no area; move it under tests/{bsrkv,bsrctl,e2e}",
        "test_stray.py: not project-wide; move it under tests/{bsrkv,bsrctl,e2e}",
    ]
