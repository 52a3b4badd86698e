"""Typed JSON for the TempoKV wire's records: each dataclass read and written by its fields'
type hints (int, float, str, bool, ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``, nested
dataclasses); a payload of another shape raises ``WireError`` naming the key or path.

Pure: no LMCache, torch or vLLM import (``tempokv.wire`` builds its records on it).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, ClassVar, Self


class WireError(ValueError):
    """A payload that does not have the shape its record defines."""


# ---- reading and writing by type hint ---------------------------------------------------
# Each type's reader and writer is built once (cached): the adapter reads and writes these
# on vLLM's engine loop, where a per-value walk over typing's introspection cost 5-10x more.

Reader = Callable[[Any, str], Any]


def decode(cls: type, raw: Any, where: str) -> Any:
    """A dataclass from its JSON object: exactly its fields as keys, each read by type."""
    return _reader(cls)(raw, where)


def encode(obj: Any) -> Any:
    """The JSON value of a dataclass (every field), tuple (list) or mapping."""
    return _writer(type(obj))(obj)


@cache
def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))


@cache
def _reader(tp: Any) -> Reader:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        read_inner = _reader(inner)
        return lambda v, w: None if v is None else read_inner(v, w)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] in _SCALARS:
            return _scalars_reader(args[0])
        item = _reader(args[0])

        def read_list(v: Any, w: str) -> tuple[Any, ...]:
            if not isinstance(v, list):
                raise WireError(f"{w}: expected a list, got {v!r}")
            return tuple(item(x, f"{w}[{i}]") for i, x in enumerate(v))

        return read_list
    if origin is tuple:
        items = [_reader(a) for a in args]

        def read_fixed(v: Any, w: str) -> tuple[Any, ...]:
            if not isinstance(v, list) or len(v) != len(items):
                raise WireError(f"{w}: expected {len(items)} items, got {v!r}")
            return tuple(r(x, f"{w}[{i}]") for i, (r, x) in enumerate(zip(items, v, strict=True)))

        return read_fixed
    if origin is dict:
        value = _reader(args[1])

        def read_map(v: Any, w: str) -> dict[str, Any]:
            if not isinstance(v, Mapping):
                raise WireError(f"{w}: expected a JSON object, got {v!r}")
            return {str(k): value(x, f"{w}.{k}") for k, x in v.items()}

        return read_map
    if dataclasses.is_dataclass(tp):
        return _record_reader(tp)
    return _scalar_reader(tp)


def _record_reader(cls: type) -> Reader:
    names = frozenset(n for n, _ in _fields(cls))
    readers = [(n, _reader(h)) for n, h in _fields(cls)]

    def read_record(raw: Any, where: str) -> Any:
        if not isinstance(raw, Mapping):
            raise WireError(f"{where}: expected a JSON object, got {raw!r}")
        if raw.keys() != names:
            missing, extra = sorted(names - set(raw)), sorted(set(raw) - names)
            raise WireError(f"{where}: missing keys {missing}, unexpected keys {extra}")
        return cls(**{n: r(raw[n], f"{where}.{n}") for n, r in readers})

    return read_record


_SCALARS = (int, float, str, bool)


def _scalars_reader(tp: type) -> Reader:
    """A list of one scalar type (a hit's token ids: thousands of them, read on the server's
    request thread ahead of the lookups): checked in one pass over the items' types, the
    offending index found only when one is wrong."""
    item = _scalar_reader(tp)
    allowed = {int, float} if tp is float else {tp}

    def read_scalars(v: Any, w: str) -> tuple[Any, ...]:
        if not isinstance(v, list):
            raise WireError(f"{w}: expected a list, got {v!r}")
        if not set(map(type, v)) <= allowed:
            for i, x in enumerate(v):
                item(x, f"{w}[{i}]")  # raises, naming the first wrong item
        return tuple(map(float, v)) if tp is float else tuple(v)

    return read_scalars


def _scalar_reader(tp: Any) -> Reader:
    if tp is bool:
        ok: Callable[[Any], bool] = lambda v: isinstance(v, bool)  # noqa: E731
    elif tp is int:
        ok = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    elif tp is float:
        ok = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
    elif tp is str:
        ok = lambda v: isinstance(v, str)  # noqa: E731
    else:
        raise TypeError(f"the wire carries no {tp!r}")  # a record's field, not a payload
    as_float = tp is float

    def read_scalar(v: Any, w: str) -> Any:
        if not ok(v):
            raise WireError(f"{w}: expected {tp.__name__}, got {v!r}")
        return float(v) if as_float else v

    return read_scalar


@cache
def _writer(tp: type) -> Callable[[Any], Any]:
    if dataclasses.is_dataclass(tp):
        fields = [(n, _field_writer(h)) for n, h in _fields(tp)]
        return lambda obj: {n: w(getattr(obj, n)) for n, w in fields}
    if issubclass(tp, tuple | list):
        return lambda obj: [encode(x) for x in obj]
    if issubclass(tp, Mapping):
        return lambda obj: {str(k): encode(v) for k, v in obj.items()}
    return lambda obj: obj


@cache
def _field_writer(hint: Any) -> Callable[[Any], Any]:
    """A field's writer from its type hint: a tuple of scalars (a hit's token ids) is one
    ``list`` call, not an ``encode`` per item; anything else by its value's type."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] in _SCALARS:
            return list
    return encode


class Record:
    """``to_json`` / ``from_json`` of a frozen dataclass over its fields' type hints."""

    WHAT: ClassVar[str] = "tempokv record"

    def to_json(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        return decode(cls, raw, cls.WHAT)
