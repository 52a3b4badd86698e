"""The source reader over small trees written here: members a class defines or assigns to
``self`` (its bases' too), re-exports, star imports, parameters in order, flags, a compiled
module's exports; and an invariant over generated classes (Hypothesis)."""

from __future__ import annotations

import keyword
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bsrkv.hostsurface.check import check, check_name, release
from bsrkv.hostsurface.declared import parse
from bsrkv.hostsurface.source import Tree

BASE = """
from enum import Enum

class Base:
    kind: str = "x"

    def __init__(self):
        self.waiting = []
        if True:
            self.inner: int = 0

    def schedule(self, out, *, budget=1):
        return out

class Status(Enum):
    WAITING = 1
"""
SUB = """
from .base import Base as _B

class Sub(_B):
    def add(self, request, extra):
        self.running = request
"""


def write(tmp_path: Path) -> Tree:
    pkg = tmp_path / "pkg"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("from pkg.core.base import *\n")
    (pkg / "core" / "base.py").write_text(BASE)
    (pkg / "core" / "sub.py").write_text(SUB)
    (pkg / "native.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF..Bitmap\x00")
    (pkg / "v1").mkdir()
    (pkg / "v1" / "args.py").write_text('p.add_argument("--chunk-size")\n')
    return Tree(tmp_path, "pkg")


def rows(tree: Tree, *entries: str) -> list[tuple[str, bool, str]]:
    out = []
    for e in entries:
        r = check_name(tree, parse("user", e))
        out.append((e, r.ok, r.why))
    return out


def test_members_re_exports_parameters_and_natives(tmp_path: Path) -> None:
    tree = write(tmp_path)
    assert rows(
        tree,
        "pkg.core:Base.waiting",  # a star import, then what __init__ assigns to self
        "pkg.core:Base.inner",  # annotated, under an if
        "pkg.core.sub:Sub.kind",  # the base's class attribute, through an aliased import
        "pkg.core.sub:Sub.running",
        "pkg.core.sub:Sub.schedule(out, budget)",
        "pkg.core.sub:Sub.schedule(budget, out)",  # the declared order is held
        "pkg.core.sub:Sub.add(request)",
        "pkg.core.base:Status.WAITING",
        "pkg.core.base:Status.DONE",
        "pkg.core.sub:Sub.missing",
        "pkg.core:Nothing",
        "pkg.nope:X",
        "pkg.native:Bitmap",
        "pkg.native:Other",
        "pkg.core.sub",
        "pkg:core",  # a subpackage is an attribute of its package
    ) == [
        ("pkg.core:Base.waiting", True, ""),
        ("pkg.core:Base.inner", True, ""),
        ("pkg.core.sub:Sub.kind", True, ""),
        ("pkg.core.sub:Sub.running", True, ""),
        ("pkg.core.sub:Sub.schedule(out, budget)", True, ""),
        ("pkg.core.sub:Sub.schedule(budget, out)", False,
         "parameters (out, budget), not (budget, out)"),
        ("pkg.core.sub:Sub.add(request)", True, ""),
        ("pkg.core.base:Status.WAITING", True, ""),
        ("pkg.core.base:Status.DONE", False, "Status has no DONE"),
        ("pkg.core.sub:Sub.missing", False, "Sub has no missing"),
        ("pkg.core:Nothing", False, "pkg.core has no Nothing"),
        ("pkg.nope:X", False, "no module pkg.nope"),
        ("pkg.native:Bitmap", True, ""),
        ("pkg.native:Other", False, "pkg.native has no Other"),
        ("pkg.core.sub", True, ""),
        ("pkg:core", True, ""),
    ]  # fmt: skip


def test_flags_are_argparse_literals_or_dataclass_fields(tmp_path: Path) -> None:
    tree = write(tmp_path)
    tree.root.joinpath("pkg", "v1", "cfg.py").write_text("class A:\n    read_ttl: int = 0\n")
    # FLAG_DIRS has no "pkg": nothing is searched, every flag is missing
    assert rows(tree, "pkg:--chunk-size") == [("pkg:--chunk-size", False, "no flag --chunk-size")]
    lmc = tmp_path / "lm"
    (lmc / "lmcache" / "v1").mkdir(parents=True)
    (lmc / "lmcache" / "v1" / "args.py").write_text(
        'p.add_argument("--chunk-size")\nclass A:\n    l1_read_ttl: int = 0\n'
    )
    t = Tree(lmc, "lmcache")
    assert rows(t, "lmcache:--chunk-size", "lmcache:--l1-read-ttl", "lmcache:--no-chunk-size",
                "lmcache:--size") == [
        ("lmcache:--chunk-size", True, ""),
        ("lmcache:--l1-read-ttl", True, ""),
        ("lmcache:--no-chunk-size", True, ""),  # argparse's BooleanOptionalAction makes it
        ("lmcache:--size", False, "no flag --size"),
    ]  # fmt: skip


def test_no_tree_at_all_misses_every_name(tmp_path: Path) -> None:
    report = check("vllm", tmp_path, (parse("u", "vllm.config:ModelConfig"),))
    assert (report.version, [(str(r.name), r.ok, r.why) for r in report.rows]) == (
        None, [("vllm.config.ModelConfig", False, "no vllm")],
    )  # fmt: skip


def test_release_reads_the_leading_numbers() -> None:
    assert [release(v) for v in ("0.34.0", "0.32.0+cpu", "0.35.0rc1", "1.0.post2", "x")] == [
        (0, 34, 0), (0, 32, 0), (0, 35, 0), (1, 0), (),
    ]  # fmt: skip


IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s)
)


@given(
    body=st.sets(IDENT, max_size=6),
    assigned=st.sets(IDENT, max_size=6),
    inherited=st.sets(IDENT, max_size=6),
    probe=IDENT,
)
def test_a_member_is_found_exactly_when_the_class_or_a_base_has_it(
    tmp_path_factory, body: set[str], assigned: set[str], inherited: set[str], probe: str
) -> None:
    root = tmp_path_factory.mktemp("gen")
    (root / "g").mkdir()
    base = "class B:\n    pass\n" + "".join(f"    {n} = 0\n" for n in sorted(inherited))
    sub = "class C(B):\n    def __init__(self):\n        pass\n"
    sub += "".join(f"        self.{n} = 1\n" for n in sorted(assigned))
    sub += "".join(f"    def {n}(self):\n        pass\n" for n in sorted(body))
    (root / "g" / "__init__.py").write_text("")
    (root / "g" / "m.py").write_text(base + sub)
    tree = Tree(root, "g")
    names = body | assigned | inherited | {"__init__"}
    for n in names | {probe}:
        assert check_name(tree, parse("u", f"g.m:C.{n}")).ok == (n in names)
