"""The typed reader and writer behind every ``bsr.*`` reply (``protocol``): each field names
its JSON reader (and, where the wire differs from the value, its writer) in its metadata;
``Reply.from_json`` refuses a missing, unexpected or mistyped key. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field, fields
from typing import Any, ClassVar, Self


class ProtocolError(ValueError):
    """A reply that does not have the shape its type defines."""


# ---- readers: (JSON value, where) -> value ----------------------------------------------


def _int(v: Any, w: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError(f"{w}: expected an integer, got {v!r}")
    return v


def _opt_int(v: Any, w: str) -> int | None:
    return None if v is None else _int(v, w)


def _float(v: Any, w: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ProtocolError(f"{w}: expected a number, got {v!r}")
    return float(v)


def _opt_float(v: Any, w: str) -> float | None:
    return None if v is None else _float(v, w)


def _str(v: Any, w: str) -> str:
    if not isinstance(v, str):
        raise ProtocolError(f"{w}: expected a string, got {v!r}")
    return v


def _bool(v: Any, w: str) -> bool:
    if not isinstance(v, bool):
        raise ProtocolError(f"{w}: expected a boolean, got {v!r}")
    return v


def _obj(v: Any, w: str) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise ProtocolError(f"{w}: expected a JSON object, got {v!r}")
    return dict(v)


def _counts(v: Any, w: str) -> dict[str, int]:
    return {str(k): _int(n, f"{w}.{k}") for k, n in _obj(v, w).items()}


def _by_rank(v: Any, w: str) -> dict[int, int]:
    out = {}
    for k, n in _obj(v, w).items():
        try:
            out[int(k)] = _int(n, f"{w}.{k}")
        except ValueError:
            raise ProtocolError(f"{w}: rank key {k!r} is not an integer") from None
    return out


def _phases(v: Any, w: str) -> tuple[dict[str, float], ...]:
    if not isinstance(v, list):
        raise ProtocolError(f"{w}: expected a list, got {v!r}")
    return tuple({str(k): _float(x, f"{w}.{k}") for k, x in _obj(o, w).items()} for o in v)


def _list_of(read: Callable[[Any], Any]) -> Callable[[Any, str], tuple[Any, ...]]:
    def read_list(v: Any, w: str) -> tuple[Any, ...]:
        if not isinstance(v, list):
            raise ProtocolError(f"{w}: expected a list, got {v!r}")
        return tuple(read(x) for x in v)

    return read_list


def _reply(cls: type[Reply]) -> Callable[[Any, str], Any]:
    return lambda v, _w: cls.from_json(v)


# ---- writers: value -> JSON value --------------------------------------------------------


def _ranked(by_rank: Mapping[int, int]) -> dict[str, int]:
    return {str(r): b for r, b in sorted(by_rank.items())}


def _plain(v: Any) -> Any:
    if isinstance(v, Reply):
        return v.to_json()
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return dict(v)
    return v


def _f(read: Callable[[Any, str], Any], write: Callable[[Any], Any] = _plain, **kw: Any) -> Any:
    """A field read (and written) by these functions."""
    return field(metadata={"read": read, "write": write}, **kw)


class Reply:
    """to_json / from_json over the fields' readers and writers. A reply has exactly its
    fields as keys; ``OPTIONAL`` names those that may be absent (then their default)."""

    WHAT: ClassVar[str] = "reply"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {f.name: f.metadata["write"](getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_json(cls, raw: Any) -> Self:
        w = cls.WHAT
        raw = _obj(raw, w)
        names = {f.name for f in fields(cls)}
        missing = sorted(names - cls.OPTIONAL - set(raw))
        extra = sorted(set(raw) - names)
        if missing or extra:
            raise ProtocolError(f"{w}: missing keys {missing}, unexpected keys {extra}")
        return cls(
            **{
                f.name: f.metadata["read"](raw[f.name], f"{w}.{f.name}")
                for f in fields(cls)
                if f.name in raw
            }
        )
