"""The server module's config: the restore settings plus one test-only knob.

W, B and every timeout are ``bsrkv.settings.RestoreSettings``' fields with its defaults
(window 30 s, probe 10 s, admission 120 s, retrieve deadline 45 s, drain 5 s, stall
guard 5 s); the core's ``RestoreConfig`` is built from it with ``core_config()``. The
``--server-module`` ``config`` object and a ``bsr.configure`` payload are parsed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError, field_validator
from pydantic_core import PydanticCustomError

from bsrkv.settings import RestoreSettings


class ServerConfigError(ValueError):
    """A config or ``bsr.*`` payload the server module refuses (never the CLI's error:
    this runs inside the LMCache server process)."""


class ServerModuleConfig(RestoreSettings):
    """The ``config`` object of ``--server-module`` (extra keys are refused)."""

    # TEST ONLY: raise inside the install of this window index (-1 = never). The failure
    # matrices inject faults by real means (L2 adapters); this knob exists for the
    # "raised error in install" case alone.
    test_only_fail_install_window: int = -1

    @field_validator("*", mode="before")
    @classmethod
    def _json_types_only(cls, value: Any, info: Any) -> Any:
        """No coercion from strings or booleans: a number field takes a JSON number, a
        boolean field a JSON boolean (an integral float still fits an integer field)."""
        kind = cls.model_fields[info.field_name].annotation
        if kind is bool and not isinstance(value, bool):
            raise PydanticCustomError("not_a_boolean", "must be a boolean")
        if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise PydanticCustomError("not_a_number", "must be a number")
        return value

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> ServerModuleConfig:
        """Validate a JSON config object; ServerConfigError names the field and the fix."""
        try:
            return cls(**dict(raw or {}))
        except ValidationError as e:
            raise ServerConfigError(_message(e, dict(raw or {}))) from None

    def merged(self, changes: Mapping[str, Any]) -> ServerModuleConfig:
        """This config with ``changes`` applied (a ``bsr.configure`` payload)."""
        return ServerModuleConfig.parse({**self.model_dump(), **changes})


def _message(err: ValidationError, raw: dict[str, Any]) -> str:
    """The first error, phrased as the fix (every unknown key at once)."""
    errors = err.errors()
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        valid = sorted(ServerModuleConfig.model_fields)
        return f"bsr server module: unknown config key(s) {unknown}; valid: {valid}"
    e = errors[0]
    name = str(e["loc"][0]) if e["loc"] else ""
    value = raw.get(name, e.get("input"))
    field = ServerModuleConfig.model_fields.get(name)
    if field is not None and field.annotation is float and type(value) is int:
        value = float(value)  # as the field holds it
    kind, ctx = e["type"], e.get("ctx") or {}
    if kind == "not_a_number":
        return f"bsr server module: {name} must be a number, got {value!r}"
    if kind == "not_a_boolean":
        return f"bsr server module: {name} must be a boolean, got {value!r}"
    if kind.startswith("int_"):
        return f"bsr server module: {name} must be an integer, got {value!r}"
    if kind == "greater_than":
        return f"{name} must be > {_bound(ctx['gt'])}, got {value}"
    if kind == "greater_than_equal":
        return f"{name} must be >= {_bound(ctx['ge'])}, got {value}"
    if kind == "value_error" and "error" in ctx:  # a model rule, e.g. B >= W
        return str(ctx["error"])
    return f"bsr server module: {name or 'config'}: {e['msg']}"


def _bound(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v
