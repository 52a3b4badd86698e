"""The docs a newcomer reads: a README under 10 KB that starts with the two commands, pages
whose relative links resolve, no issue numbers, no citation of a document the project does
not hold, and the attach page's command lines in the form tests/e2e/attach starts them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    text = README.read_text()
    assert len(README.read_bytes()) < 10 * 1024
    first = text.split("```", 2)[1]  # the first code block
    assert [line.split()[:2] for line in first.splitlines()[1:]] == [
        ["make", "demo"],
        ["make", "test"],
    ]
    for heading in ("## Verdicts and exit codes", "## Attach to a running deployment"):
        assert heading in text
    assert "(docs/attach.md)" in text


def test_every_relative_link_resolves() -> None:
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if path and "://" not in target and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert missing == []


def test_no_issue_numbers_in_the_docs() -> None:
    pattern = re.compile(r"(?i)\bissue\s+\d+|(?<![\w/])#\d+\b")
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_no_citation_of_a_document_the_project_does_not_hold() -> None:
    gone = ("STACK" + "-NOTES", "DESIGN" + ".md", "../" + "shared", "docs/architecture" + ".md")
    roots = ["bsrctl", "tests", "bench", "docs", "ladders", "matrices"]
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    kinds = {".py", ".md", ".yaml"}
    files += [p for r in roots for p in (ROOT / r).rglob("*") if p.suffix in kinds]
    found = [f"{p.relative_to(ROOT)}: {g}" for p in files for g in gone if g in p.read_text()]
    assert found == []


def _operator_stack():
    path = ROOT / "tests" / "e2e" / "attach" / "operator_stack.py"
    spec = importlib.util.spec_from_file_location("operator_stack_docs", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_attach_page_holds_the_command_lines_tests_attach_starts() -> None:
    op = _operator_stack()
    lmcache, vllm = op.readme_block("lmcache"), op.readme_block("vllm")
    faults = op.readme_block("lmcache-l2-faults")
    assert [w for w in lmcache if w.startswith("BSRKV_CONTROL_TOKEN=")]
    assert lmcache[lmcache.index("--l1-size-gb") + 1]  # the value operator_stack replaces
    assert "--server-module" in lmcache and "--l2-adapter" in lmcache
    assert "--enable-prompt-tokens-details" in vllm and "VLLM_SERVER_DEV_MODE=1" in vllm
    assert faults[0] == "--l2-adapter" and len(faults) == 2
    assert "pip install ./mechanisms" in op.ATTACH_DOC.read_text()


def test_attach_page_names_the_modules_bsrctl_loads() -> None:
    """The server module and the fault adapter of the attach page are the ones bsrctl's own
    launched stacks load (bsrkv's, once the mechanisms live in their own distribution)."""
    import json

    from bsrctl.stack.launch.extensions import BSR_SERVER_MODULE, FAULT_ADAPTER_MODULE

    op = _operator_stack()
    lmcache = op.readme_block("lmcache")
    module = json.loads(lmcache[lmcache.index("--server-module") + 1])["module_path"]
    adapter = json.loads(op.readme_block("lmcache-l2-faults")[1])["module_path"]
    assert (module, adapter) == (BSR_SERVER_MODULE, FAULT_ADAPTER_MODULE)
