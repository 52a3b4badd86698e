"""Strict JSON records: the one library behind the ``bsr.*`` replies
(``lmcache_ext.bsr.protocol``) and the ``tempokv.*`` wire (``tempokv.wire``).

Built on msgspec rather than pydantic: both hosts already bring it (LMCache and vLLM depend
on it), its ``Struct`` is a frozen record checked in C, so the per-step ``tempokv.update``
on vLLM's engine loop costs a fraction of a Python walk over the fields, and
``convert(..., strict=True)`` coerces nothing ("1", 1.0 and true are not ints), where
pydantic's strict mode would also refuse the lists JSON gives for tuples.

A record has exactly its fields as keys: unknown keys are refused by msgspec, and a field is
required on the wire unless the record's ``OPTIONAL`` names it, even when its constructor
has a default (msgspec reads a defaulted field as optional, so those records, and plain
dataclasses, are checked here first). Errors keep one wording whichever side raised them,
naming the path (``tempokv.update.hits.k.world_size``), which msgspec's own messages lose
at a map's key; the walk that words them runs only on a refusal. Pure: msgspec only.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar, Self

import msgspec
from msgspec import inspect as mi


class Rank(int):
    """A map key that is an int here and a string on the wire (JSON keys are strings)."""


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Rank:
        if type(obj) is int or (type(obj) is str and obj.lstrip("-").isdigit()):
            return Rank(int(obj))
        raise ValueError(f"rank key {obj!r} is not an integer")
    raise NotImplementedError(tp)


class Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A frozen record read and written as one JSON object."""

    WHAT: ClassVar[str] = "record"  # names the record in errors
    ERROR: ClassVar[type[ValueError]] = ValueError  # what a bad payload raises
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()  # keys that may be absent (the default)

    def to_json(self) -> dict[str, Any]:
        return encode(self)  # type: ignore[no-any-return]

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        return decode(cls, raw, cls.WHAT, cls.ERROR)  # type: ignore[no-any-return]


_SCALARS = frozenset({int, float, str, bool, type(None)})


def encode(obj: Any) -> Any:
    """The JSON value of a record (every field; ``omit_defaults`` records leave their
    unset ones out), a dataclass, a tuple or a map: lists and string keys, as JSON has."""
    return _lists(msgspec.to_builtins(obj, str_keys=True, enc_hook=_enc_hook))


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Rank):
        return str(int(obj))
    raise NotImplementedError(type(obj))


def _lists(v: Any) -> Any:
    t = type(v)
    if t is dict:
        return {k: _lists(x) for k, x in v.items()}
    if t is tuple or t is list:
        # a list of scalars (a hit's thousands of token ids) in one C-level pass
        return list(v) if set(map(type, v)) <= _SCALARS else [_lists(x) for x in v]
    return v


def decode(tp: type, raw: Any, where: str, error: type[ValueError] = ValueError) -> Any:
    """``tp`` (a ``Strict`` record or a dataclass) from its JSON value, or ``error`` naming
    the first wrong key or value by its path."""
    if _prechecked(tp):
        _raise_if(explain(tp, raw, where), error)
    try:
        return msgspec.convert(raw, tp, strict=True, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        if isinstance(exc.__cause__, error):  # a record's own rule (its __post_init__)
            raise exc.__cause__ from None
        raise error(explain(tp, raw, where) or f"{where}: {exc}") from None


def _raise_if(message: str | None, error: type[ValueError]) -> None:
    if message is not None:
        raise error(message) from None


# ---- the wording of a refusal (and the keys msgspec would read as optional) --------------


def _required(info: mi.StructType | mi.DataclassType, tp: type) -> frozenset[str]:
    optional: frozenset[str] = getattr(tp, "OPTIONAL", frozenset())
    return frozenset(f.name for f in info.fields) - optional


@cache
def _prechecked(tp: type) -> bool:
    """Whether msgspec alone would accept a payload this wire refuses: a dataclass (its
    unknown keys are ignored) or a record with a defaulted key the wire requires."""
    seen: set[int] = set()

    def walk(t: mi.Type) -> bool:
        if id(t) in seen:
            return False
        seen.add(id(t))
        if isinstance(t, mi.DataclassType):
            return True
        if isinstance(t, mi.StructType):
            defaulted = {f.name for f in t.fields if not f.required}
            return bool(defaulted & _required(t, t.cls)) or any(walk(f.type) for f in t.fields)
        return any(walk(c) for c in _children(t))

    return walk(mi.type_info(tp))


def _children(t: mi.Type) -> list[mi.Type]:
    if isinstance(t, mi.UnionType):
        return list(t.types)
    if isinstance(t, mi.VarTupleType | mi.ListType):
        return [t.item_type]
    if isinstance(t, mi.TupleType):
        return list(t.item_types)
    if isinstance(t, mi.DictType):
        return [t.value_type]
    return []


_NAMES = {mi.IntType: "int", mi.FloatType: "float", mi.StrType: "str", mi.BoolType: "bool"}


def explain(tp: type, raw: Any, where: str) -> str | None:
    """What is wrong with ``raw`` as a ``tp``, worded by its path; None when nothing is."""
    return _explain(mi.type_info(tp), raw, where)


def _explain(t: mi.Type, v: Any, w: str) -> str | None:  # noqa: PLR0911 - one case a type
    if isinstance(t, mi.AnyType):
        return None
    if isinstance(t, mi.UnionType):  # X | None: the only unions on these wires
        (inner,) = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return None if v is None else _explain(inner, v, w)
    if isinstance(t, mi.StructType | mi.DataclassType):
        if not isinstance(v, dict):
            return f"{w}: expected a JSON object, got {v!r}"
        names = {f.name for f in t.fields}
        missing, extra = sorted(_required(t, t.cls) - set(v)), sorted(set(v) - names)
        if missing or extra:
            return f"{w}: missing keys {missing}, unexpected keys {extra}"
        found = (_explain(f.type, v[f.name], f"{w}.{f.name}") for f in t.fields if f.name in v)
        return next((m for m in found if m), None)
    if isinstance(t, mi.VarTupleType | mi.ListType | mi.TupleType):
        if not isinstance(v, list | tuple):
            return f"{w}: expected a list, got {v!r}"
        if isinstance(t, mi.TupleType):
            if len(v) != len(t.item_types):
                return f"{w}: expected {len(t.item_types)} items, got {v!r}"
            items = list(t.item_types)
        else:
            items = [t.item_type] * len(v)
        pairs = enumerate(zip(items, v, strict=True))
        found = (_explain(it, x, f"{w}[{i}]") for i, (it, x) in pairs)
        return next((m for m in found if m), None)
    if isinstance(t, mi.DictType):
        if not isinstance(v, dict):
            return f"{w}: expected a JSON object, got {v!r}"
        for k, x in v.items():
            if isinstance(t.key_type, mi.CustomType):  # Rank
                try:
                    _dec_hook(t.key_type.cls, k)
                except ValueError as exc:
                    return f"{w}: {exc}"
            elif not isinstance(k, str):
                return f"{w}: key {k!r} is not a string"
            m = _explain(t.value_type, x, f"{w}.{k}")
            if m:
                return m
        return None
    return _scalar(t, v, w)


def _scalar(t: mi.Type, v: Any, w: str) -> str | None:
    if isinstance(t, mi.NoneType):
        return None if v is None else f"{w}: expected null, got {v!r}"
    name = _NAMES.get(type(t))
    if name is None:
        return None  # a type msgspec checks alone; its message is used as it is
    ok = {
        "int": isinstance(v, int) and not isinstance(v, bool),
        "float": isinstance(v, int | float) and not isinstance(v, bool),
        "str": isinstance(v, str),
        "bool": isinstance(v, bool),
    }[name]
    return None if ok else f"{w}: expected {name}, got {v!r}"


__all__ = ["Rank", "Strict", "decode", "encode", "explain"]
