"""What a package's *source* defines, read with ``ast``: nothing of it is imported.

A vLLM or LMCache tree is read where it lies (``site-packages`` of this interpreter, or a
wheel unpacked in a side folder): no torch, no GPU, no 10 s ``import vllm``, and the same
answer for vLLM 0.32 installed and 0.34 unpacked. A compiled module (``lmcache_native``) is
read as bytes: a name it exports is in its symbol strings.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

# Where each package's command-line flags are declared (argparse literals or dataclass fields).
FLAG_DIRS = {"vllm": ("engine", "entrypoints"), "lmcache": ("v1",)}


def installed_root(package: str) -> Path | None:
    """The folder holding ``package`` for this interpreter (its parent folder), or None.
    ``find_spec`` of a top-level package runs none of its code."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


@dataclass(frozen=True)
class Found:
    """Where a name is defined: its module and node (a class or function), or only bound."""

    module: str
    node: ast.AST | None = None


@dataclass
class Tree:
    """One package's source under ``root`` (the folder that holds the package folder)."""

    root: Path
    package: str
    _parsed: dict[str, ast.Module | None] = field(default_factory=dict)
    _members: dict[str, dict[str, ast.AST]] = field(default_factory=dict)
    read: set[Path] = field(default_factory=set)  # every file a check read

    def path(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for p in (base.with_suffix(".py"), base / "__init__.py"):
            if p.is_file():
                return p
        return None

    def native(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        found = sorted(base.parent.glob(f"{base.name}.*.so")) if base.parent.is_dir() else []
        return found[0] if found else None

    def exists(self, module: str) -> bool:
        found = self.path(module) or self.native(module)
        self.read |= {found} if found else set()
        return found is not None

    def parse(self, module: str) -> ast.Module | None:
        if module not in self._parsed:
            p = self.path(module)
            self._parsed[module] = ast.parse(p.read_bytes()) if p else None
            self.read |= {p} if p else set()
        return self._parsed[module]

    def resolve(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> Found | None:
        """Where ``module.name`` is defined, following re-exports and star imports."""
        key = f"{module}:{name}"
        if key in seen:
            return None
        seen = seen | {key}
        tree = self.parse(module)
        if tree is None:
            so = self.native(module)
            self.read |= {so} if so else set()
            return Found(module) if so and name.encode() in so.read_bytes() else None
        stars = []
        for stmt in _top(tree.body):
            if isinstance(stmt, ast.ImportFrom):
                src = _absolute(module, stmt, self.path(module))
                for a in stmt.names:
                    if a.name == "*":
                        stars.append(src)
                    elif (a.asname or a.name) == name:
                        return self._follow(src, a.name, seen) or Found(module)
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    if a.asname == name:
                        return Found(a.name)
            elif name in _bound(stmt):
                node = stmt if isinstance(stmt, ast.ClassDef | ast.FunctionDef) else None
                return Found(module, node)
        for src in stars:
            if (got := self.resolve(src, name, seen)) is not None:
                return got
        if self.exists(f"{module}.{name}"):
            return Found(f"{module}.{name}")
        return None

    def _follow(self, src: str, name: str, seen: frozenset[str]) -> Found | None:
        if src.split(".")[0] != self.package or not self.exists(src):
            return None  # another package's name (torch's, pydantic's): bound, not followed
        return self.resolve(src, name, seen)

    def members(self, found: Found, seen: frozenset[str] = frozenset()) -> dict[str, ast.AST]:
        """A class's members, its bases' (in this tree) included: what its body defines and
        what its methods assign to ``self``."""
        cls = found.node
        if not isinstance(cls, ast.ClassDef) or f"{found.module}:{cls.name}" in seen:
            return {}
        key = f"{found.module}:{cls.name}"
        if key in self._members:
            return self._members[key]
        seen = seen | {key}
        out: dict[str, ast.AST] = {}
        for base in reversed(cls.bases):
            ref = base.value if isinstance(base, ast.Subscript) else base
            got = None
            if isinstance(ref, ast.Name):
                got = self.resolve(found.module, ref.id)
            elif isinstance(ref, ast.Attribute) and isinstance(ref.value, ast.Name):
                mod = self.resolve(found.module, ref.value.id)
                got = self.resolve(mod.module, ref.attr) if mod and mod.node is None else None
            if got is not None:
                out.update(self.members(got, seen))
        for stmt in _top(cls.body):
            for n in _bound(stmt):
                out[n] = stmt
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                for sub in ast.walk(stmt):
                    for target in _targets(sub):
                        if _is_self_attr(target):
                            out.setdefault(target.attr, sub)  # type: ignore[attr-defined]
        self._members[key] = out
        return out

    def has_flag(self, flag: str) -> bool:
        """Whether an argparse literal ``"--flag"`` or a dataclass field ``flag:`` (the
        generated flags) is in the package's argument modules."""
        bare = flag.removeprefix("--").removeprefix("no-")
        literal = re.compile(rf"[\"']--{re.escape(bare)}[\"']")
        field_ = re.compile(rf"^\s+{re.escape(bare.replace('-', '_'))}\s*:", re.M)
        for sub in FLAG_DIRS.get(self.package, ()):
            for p in sorted((self.root / self.package / sub).rglob("*.py")):
                text = p.read_text(errors="replace")
                if literal.search(text) or field_.search(text):
                    self.read.add(p)
                    return True
        return False


def params(node: ast.AST) -> tuple[str, ...]:
    """A function's positional parameter names, ``self``/``cls`` left out."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return ()
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    return tuple(names[1:] if names[:1] in (["self"], ["cls"]) else names)


def _top(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements of a body, those under ``if``/``try``/``with`` included (not defs')."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, ast.If | ast.With):
            out += _top(stmt.body) + _top(getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            out += _top(stmt.body) + _top(stmt.orelse) + _top(stmt.finalbody)
            for h in stmt.handlers:
                out += _top(h.body)
    return out


def _bound(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return [stmt.name]
    return [t.id for t in _targets(stmt) if isinstance(t, ast.Name)]


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        flat: list[ast.expr] = []
        for t in node.targets:
            flat += list(t.elts) if isinstance(t, ast.Tuple) else [t]
        return flat
    if isinstance(node, ast.AnnAssign | ast.AugAssign):
        return [node.target]
    return []


def _is_self_attr(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _absolute(module: str, stmt: ast.ImportFrom, path: Path | None) -> str:
    if not stmt.level:
        return stmt.module or ""
    parts = module.split(".")
    package = parts if path is not None and path.name == "__init__.py" else parts[:-1]
    base = package[: len(package) - stmt.level + 1]
    return ".".join([*base, *([stmt.module] if stmt.module else [])])
