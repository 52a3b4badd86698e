"""Reading specs: strict pydantic models, YAML, byte sizes, and one-line errors that name the
field and the fix (exit 2). Every spec module builds on this; it knows no spec itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from bsrctl.errors import BadInput

M = TypeVar("M", bound=BaseModel)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
UNITS |= {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(value: Any) -> Any:
    """2147483648, "2 GiB", "512MiB", "1.5 GiB" -> int bytes; anything else left to pydantic."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in UNITS:
            raise ValueError(f"{value!r} is not a byte size; write e.g. 2147483648 or '2 GiB'")
        n = float(m.group(1)) * UNITS[m.group(2).lower()]
        if n != int(n):
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return int(n)
    return value


ByteSize = Annotated[int, BeforeValidator(parse_bytes), Field(gt=0)]


def read_yaml(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"spec file {path} does not exist; pass the path of a YAML spec")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:  # its text spans lines: one line, where and what
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise BadInput(f"{path}: not valid YAML{at} ({what}); fix the syntax") from None
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not valid YAML (not UTF-8 text); fix the encoding") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: the top level must be a mapping of fields")
    return doc


# The tags of discriminated unions (a failure-matrix cell's kind): pydantic puts them in an
# error's path, where the spec's author never wrote them, so the path drops them.
UNION_TAGS: set[str] = set()


def describe_error(model: type[BaseModel], exc: ValidationError) -> str:
    """One line: the first error's field path, what is wrong, and how to fix it."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"] if p not in UNION_TAGS)
    where = ".".join(str(p) for p in loc) or "(spec)"
    if err["type"] == "extra_forbidden":
        parent = _submodel(model, loc[:-1])
        valid = ", ".join(parent.model_fields) if parent else "see the docs"
        return f"{where}: unknown field; valid fields here: {valid}"
    if err["type"] == "literal_error":
        return f"{where}: {err['msg']}"
    if err["type"] == "value_error" and not err["loc"]:  # a model rule: its message names
        return str((err.get("ctx") or {}).get("error", err["msg"]))  # the fields, no input
    return f"{where}: {err['msg']} (got {_short(err.get('input'))})"


def _short(value: Any, limit: int = 80) -> str:
    """A value as the message quotes it: a whole section would drown the line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _submodel(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        field = cur.model_fields.get(str(part))
        if field is None:
            return None
        cur = _model_in(field.annotation)
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _model_in(annotation: Any) -> Any:
    """The model inside `X | None` (an optional section), else the annotation itself."""
    models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else annotation


def load_spec(path: Path, model: type[M]) -> tuple[M, dict[str, Any]]:
    """Validate a YAML file into `model`; BadInput (exit 2) with one line on any problem."""
    raw = read_yaml(path)
    try:
        return model.model_validate(raw), raw
    except ValidationError as exc:
        raise BadInput(f"{path}: {describe_error(model, exc)}") from None
