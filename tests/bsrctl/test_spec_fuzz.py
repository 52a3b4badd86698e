"""Specs fuzzed: generated specs (the shipped ones, each mutated once: a key misspelt at
any depth, a value of the wrong type, a huge or negative size, an unknown kind, a key
dropped; and files that are not YAML, not a mapping, or empty) through every command's
loading path. Each ends in a valid load or BadInput: exit 2 with one line naming a field,
never a traceback, never another exit code. Nothing starts: the experiment commands are
fed to the CLI only once their loader refused the spec (it is the first thing each run
does), and ``stack plan`` starts no process by design; a stack that did start fails it."""

from __future__ import annotations

import copy
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bsrctl.cli import app
from bsrctl.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def _experiment(command: str) -> Callable[[Path], Any]:
    def load(path: Path) -> Any:
        from bsrctl.experiments.restore.spec import load_experiment

        return load_experiment(path, command)

    return load


def _failmatrix(path: Path) -> Any:
    from bsrctl.experiments.failmatrix.spec import load_matrix

    return load_matrix(path)


def _tempokv(path: Path) -> Any:
    from bsrctl.tempokv.spec import load

    return load(path)


def _roundtrip(path: Path) -> Any:
    from bsrctl.experiments.roundtrip import RoundTripSpec
    from bsrctl.spec_io import load_spec

    return load_spec(path, RoundTripSpec)


def _plan(path: Path) -> Any:
    from bsrctl.stack.launch.plan import plan_spec

    return plan_spec(path)


# command: (the shipped specs it starts from, its loader, the CLI's argv before SPEC)
E1 = ["ladders/cpu-e1.yaml", "ladders/storage-paper.yaml", "ladders/attach.yaml"]
COMMANDS: dict[str, tuple[list[str], Callable[[Path], Any], list[str]]] = {
    "sweep": (E1, _experiment("sweep"), ["sweep"]),
    "law": (E1, _experiment("law"), ["law"]),
    "ladder": (E1[:2], _experiment("ladder"), ["ladder"]),
    "failmatrix": (["matrices/cpu.yaml", "matrices/paper.yaml"], _failmatrix, ["failmatrix"]),
    "tempokv": (
        ["ladders/tempokv-fig1.yaml", "ladders/tempokv-serving.yaml"],
        _tempokv,
        ["tempokv"],
    ),  # fmt: skip
    "roundtrip": (["ladders/demo-roundtrip.yaml"], _roundtrip, ["roundtrip"]),
    "stack plan": (
        ["ladders/cpu-e1.yaml", "ladders/gpu-1x.yaml", "ladders/dsv4-flash-tp2.yaml"],
        _plan,
        ["stack", "plan"],
    ),  # fmt: skip
}
BASES = {
    c: [yaml.safe_load((ROOT / p).read_text()) for p in ps] for c, (ps, _l, _a) in COMMANDS.items()
}

# A one-line BadInput: "<file>: <field path>: ..." or a message about the file itself.
FIELD = re.compile(r"^(--stack|[A-Za-z_][\w-]*(\[\d+\])?(\.[\w-]+(\[\d+\])?)*)[:\s]")
DOTTED = re.compile(r"\b[a-z_]+(\[\d+\])?\.[a-z_]+")  # a model rule names stack.x.y
MAX_LINE = 600
FILE_LEVEL = ("not valid YAML", "the top level must be a mapping", "does not exist")

WRONG_TYPES = st.sampled_from(["abc", "", [], [1, "x"], {}, {"x": 1}, None, True, 1.5, "2 GiB"])
SIZES = st.sampled_from([0, -1, -(10**18), 10**30, 2**63, 10**9 + 1, "-1 GiB", "1e400", 1e308])
NOT_YAML = ["stack: [unclosed", "a: b: c", "\tkey: tab", "{{{{", "%YAML 9.9\n---\nx: 1",
            "key: @reserved", "- a\nb: c"]  # fmt: skip
NOT_MAPPING = ["", "   \n", "# only a comment\n", "[1, 2]", "42", "just text", "null", "- x\n"]


def paths(doc: Any, at: tuple = ()) -> list[tuple]:
    """Every key path (and list index) of a YAML document."""
    out: list[tuple] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*at, k))
            out += paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*at, i))
            out += paths(v, (*at, i))
    return out


def _typo(key: str, how: int) -> str:
    if not key:
        return "x"
    i = how % len(key)
    return [key[:i] + key[i + 1 :] or "k", key[:i] + "x" + key[i:], key.upper(), key + "s"][how % 4]


def mutate(doc: dict, path: tuple, kind: str, value: Any, how: int) -> dict:
    doc = copy.deepcopy(doc)
    parent: Any = doc
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    if kind == "typo" and isinstance(last, str):
        parent[_typo(last, how)] = parent.pop(last)
    elif kind == "drop" and isinstance(parent, dict):
        parent.pop(last)
    elif kind == "kind":
        parent[last] = "no-such-kind" if last == "kind" else value
    else:  # a wrong type or a size
        parent[last] = value
    return doc


@st.composite
def specs(draw: st.DrawFn) -> tuple[str, str]:
    """(command, the file's text)."""
    command = draw(st.sampled_from(sorted(COMMANDS)))
    form = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "file"]))
    base = draw(st.sampled_from(BASES[command]))
    if form == "valid":
        return command, yaml.safe_dump(base)
    if form == "file":
        return command, draw(st.sampled_from(NOT_YAML + NOT_MAPPING))
    doc = base
    for _ in range(draw(st.integers(1, 2))):  # one mutation, or two in different places
        path = draw(st.sampled_from(paths(doc)))
        kind = draw(st.sampled_from(["typo", "wrong_type", "size", "drop", "kind"]))
        value = draw(SIZES if kind == "size" else WRONG_TYPES)
        doc = mutate(doc, path, kind, value, draw(st.integers(0, 1000)))
        if not isinstance(doc, dict) or not paths(doc):
            break
    return command, yaml.safe_dump(doc)


def check(command: str, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _spec, load, argv = COMMANDS[command]
    with tempfile.TemporaryDirectory(prefix="bsrctl-fuzz-") as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(text)
        try:
            load(path)
        except BadInput as exc:
            message = str(exc)
        else:
            if command == "stack plan":  # no process: the CLI's whole path, exit 0
                res = CliRunner().invoke(app, [*argv, str(path)])
                assert res.exit_code == 0 and "Traceback" not in res.output, res.output
            return
        # any other exception escaped the loader: the CLI's guard would make it exit 3
        assert "\n" not in message, message
        assert len(message) <= MAX_LINE, message  # a line to read, not the document dumped
        rest = message.removeprefix(f"{path}: ")
        named = FIELD.match(rest) or DOTTED.search(rest) or any(f in rest for f in FILE_LEVEL)
        assert named, message
        out = [] if command == "stack plan" else ["--out", str(Path(tmp) / "out")]
        res = CliRunner().invoke(app, [*argv, str(path), *out])
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
        assert len(lines) == 1 and lines[0].startswith("error: "), lines


@pytest.fixture
def no_stack(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A stack that starts, or a dead run's reclaim, fails the test."""

    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the fuzz test started a stack")

    monkeypatch.setattr("bsrctl.stack.launch.serving.stack.ServingStack.up", refuse)
    monkeypatch.setattr("bsrctl.cli.reclaim_dead_runs", lambda say=True: None)
    return monkeypatch


def _base(command: str, i: int = 0) -> dict:
    return copy.deepcopy(BASES[command][i])


def _without(doc: dict, *path: str) -> dict:
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent.pop(path[-1])
    return doc


def _with(doc: dict, value: Any, *path: str) -> dict:
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return doc


# Regressions, one per bug the fuzzer found (each crashed or printed more than one line):
# 1. a model rule's error dumped the whole document and named no field ("(spec): ...")
BUG_MODEL_RULE = ("failmatrix", yaml.safe_dump(_without(_base("failmatrix"), "stack")))
# 2. a YAML syntax error spanned several lines
BUG_YAML_LINES = ("failmatrix", "stack: [unclosed")
# 3. stack plan: a section's sizes_tokens not a list was a TypeError in its figures
BUG_PLAN_SIZES = ("stack plan", yaml.safe_dump(_with(_base("stack plan"), 0, "ladder",
                                                     "sizes_tokens")))  # fmt: skip
# 4. stack plan on cuda with the tiny model: a KeyError (its recipe's config has no vocab)
BUG_PLAN_TINY_CUDA = ("stack plan", yaml.safe_dump(_without(_base("stack plan", 1), "stack",
                                                            "vllm")))  # fmt: skip
# 5. stack.device a list: "unhashable type" from the device-dtype validator
BUG_DEVICE_LIST = ("stack plan", yaml.safe_dump(_with(_base("stack plan", 1), [], "stack",
                                                      "device")))  # fmt: skip


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(specs())
@example(BUG_MODEL_RULE)
@example(BUG_YAML_LINES)
@example(BUG_PLAN_SIZES)
@example(BUG_PLAN_TINY_CUDA)
@example(BUG_DEVICE_LIST)
def test_every_generated_spec_loads_or_is_exit_2_naming_a_field(
    no_stack: pytest.MonkeyPatch, case: tuple[str, str]
) -> None:
    check(*case, no_stack)
