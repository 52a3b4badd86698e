"""`bsrctl --help` groups the commands in panels, main jobs first, and each command's summary
reads on one line: no docstring line break cuts a sentence in the list."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from bsrctl.cli import app

PANEL = re.compile(r"^╭─ (\w+) ─")
ROW = re.compile(r"^│ (\S+)\s{2,}(.*?)\s*│$")


def listing(*args: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """(panel, [(command, summary line)]) in the order the help prints them."""
    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"}, prog_name="bsrctl")
    assert res.exit_code == 0, res.output
    panels: list[tuple[str, list[tuple[str, str]]]] = []
    for line in res.output.splitlines():
        if m := PANEL.match(line):
            panels.append((m.group(1), []))
        elif (m := ROW.match(line)) and not m.group(1).startswith("-"):
            panels[-1][1].append((m.group(1), m.group(2)))
    return [(name, rows) for name, rows in panels if rows]


def test_commands_are_grouped_main_jobs_first() -> None:
    got = [(name, [cmd for cmd, _ in rows]) for name, rows in listing()]
    assert got == [
        ("Experiments", ["sweep", "ladder", "law", "failmatrix", "roundtrip", "soak", "tempokv"]),
        ("Evidence", ["report", "runs", "compare", "verify", "export", "timeline", "schema"]),
        ("Stack", ["stack", "doctor"]),
        ("Fleet", ["fleet"]),
    ]


def test_a_summary_is_its_first_paragraph_on_one_line() -> None:
    rows = dict(row for _, rows in listing() for row in rows)
    assert rows["doctor"] == (
        "Versions of every part, the vLLM/LMCache names bsrkv and bsrctl use, the GPU (if any), "
        "a model folder, a spec's deployment, and what to do about each problem found. A "
        "machine without a GPU is never failed for it."
    )
    stack = dict(row for _, rows in listing("stack") for row in rows)
    assert stack["up"] == (
        "Start the stack a spec's `stack:` and `restore:` sections describe (W = 0) and leave "
        "it running."
    )
    fleet = dict(row for _, rows in listing("fleet") for row in rows)
    assert fleet["matrix"] == (
        "The nightly's strategy.matrix as one line of JSON: per node its runner labels, spec "
        "and command."
    )


def test_every_command_and_subcommand_has_a_panel_and_one_line_summaries() -> None:
    group = typer.main.get_command(app)
    assert all(getattr(c, "rich_help_panel", None) for c in group.commands.values())  # type: ignore[attr-defined]
    for sub in ("stack", "fleet"):
        for cmd in group.commands[sub].commands.values():  # type: ignore[attr-defined]
            assert cmd.short_help and "\n" not in cmd.short_help, cmd.name
