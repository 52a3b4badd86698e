"""The declaration is the surface bsrkv and bsrctl use, and the installed vLLM 0.32.0 and
LMCache 0.5.6 have all of it.

Every ``from vllm... import X`` / ``import lmcache...`` in bsrkv's and bsrctl's sources (at
any depth: the lazy imports inside functions too) must be declared with the module that
reads it: a new vLLM name used and not declared fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bsrctl
import bsrkv
from bsrctl.stack.doctor import uses as harness
from bsrctl.stack.doctor.uses import DECLARED
from bsrkv.hostsurface import declared as mechanisms
from bsrkv.hostsurface.check import CONNECTOR_DECLARED, check
from bsrkv.hostsurface.declared import TESTED_WITH, parse

SOURCES = {"bsrctl": Path(bsrctl.__file__).parent, "bsrkv": Path(bsrkv.__file__).parent}


def _imports() -> set[tuple[str, str, str]]:
    """(module, name, user) of every vLLM/LMCache import in bsrkv and bsrctl."""
    out = set()
    for package, base in SOURCES.items():
        for f in sorted(base.rglob("*.py")):
            user = ".".join((package, *f.relative_to(base).with_suffix("").parts))
            user = user.removesuffix(".__init__")
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    if node.module.split(".")[0] in ("vllm", "lmcache"):
                        out |= {(node.module, a.name, user) for a in node.names}
                elif isinstance(node, ast.Import):
                    out |= {
                        (a.name, "", user)
                        for a in node.names
                        if a.name.split(".")[0] in ("vllm", "lmcache")
                    }
    return out


def test_every_vllm_and_lmcache_import_is_declared_with_its_user() -> None:
    found = _imports()
    declared = {(n.module, n.name, n.user) for n in DECLARED}
    assert sorted(found - declared) == []
    # a declared import that no module makes any more is stale
    imports = {(m, n, u) for m, n, u in declared if "." not in n and not n.startswith("--")}
    stale = imports - found
    assert sorted(stale) == [
        (
            "lmcache.integration.vllm.lmcache_mp_connector",
            "",
            "bsrctl.stack.launch.serving.commands",
        ),
        (
            "vllm.distributed.kv_transfer.kv_connector.factory",
            "",
            "bsrctl.stack.launch.serving.commands",
        ),
    ]  # fmt: skip  (named by module path on vLLM's command line, not imported)
    # the scan sees module-level and function-level imports alike
    assert {
        ("vllm.v1.core.sched.scheduler", "Scheduler", "bsrkv.vllm_ext.scheduler"),
        ("vllm.models.deepseek_v4.cpu.cpu_sparse", "_NoOpEvent", "bsrctl.registration.dsv4_vllm"),
        ("lmcache.lmcache_native", "", "bsrkv.lmcache_ext.bsr.readback"),
    } <= found


def test_every_user_is_a_module_of_bsrkv_or_bsrctl() -> None:
    for user in {**mechanisms.USES, **harness.USES}:
        package, *rest = user.split(".")
        base = SOURCES[package].joinpath(*rest)
        assert base.with_suffix(".py").is_file() or (base / "__init__.py").is_file(), user


def test_each_package_declares_its_own_modules_only() -> None:
    # the plugin's declaration names no harness module: it installs without bsrctl
    assert {u.split(".")[0] for u in mechanisms.USES} == {"bsrkv"}
    assert {u.split(".")[0] for u in harness.USES} == {"bsrctl"}
    assert DECLARED == mechanisms.DECLARED + harness.HARNESS_DECLARED


def test_the_installed_vllm_and_lmcache_have_the_whole_surface() -> None:
    names = DECLARED + CONNECTOR_DECLARED
    for package in ("vllm", "lmcache"):
        report = check(package, declared=names)
        assert report.version == TESTED_WITH[package]
        assert [(str(r.name), r.why) for r in report.missing] == []
        assert len(report.rows) == sum(1 for n in names if n.package == package) > 80


def test_an_entry_parses_into_module_name_and_parameters() -> None:
    n = parse("u", "vllm.v1.core.sched.scheduler:Scheduler.update_from_output(a, b)")
    assert (n.module, n.name, n.user, n.params) == (
        "vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", "u", ("a", "b"),
    )  # fmt: skip
    assert str(n) == "vllm.v1.core.sched.scheduler.Scheduler.update_from_output(a, b)"
    flag = parse("u", "vllm:--num-gpu-blocks-override")
    assert (flag.package, flag.name, flag.is_flag, str(flag)) == (
        "vllm", "--num-gpu-blocks-override", True, "--num-gpu-blocks-override",
    )  # fmt: skip
    assert parse("u", "lmcache.lmcache_native").name == ""
    try:
        parse("u", "vllm:Scheduler(")
    except ValueError as exc:
        assert str(exc) == "hostsurface: u: malformed entry 'vllm:Scheduler('"
    else:
        raise AssertionError("a malformed entry parsed")
