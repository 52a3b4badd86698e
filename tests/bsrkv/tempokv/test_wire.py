"""The TempoKV wire: every record round-trips through JSON, and a key renamed on the
serializing side fails the other side's from_json naming it (every record, every field,
the adapter's settings and their cost model included); a mistyped value names its path."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bsrkv.tempokv import wire
from bsrkv.tempokv.live import AdapterSettings, Update
from bsrkv.tempokv.ttu import CostModel

# values a record's own checks require (the others take any value of their type)
FIXED: dict[tuple[type, str], Any] = {(wire.AdapterEnv, "transport"): "connector",
                                      (wire.TempoConfig, "tier"): "dax"}  # fmt: skip
CHOICES: dict[tuple[type, str], list[str]] = {
    (wire.AdapterEnv, "transport"): ["connector", "record"],
    (wire.TempoConfig, "tier"): ["l2", "dax"],
}


def _is_record(tp: Any) -> bool:
    """A wire record (a msgspec struct) or a dataclass it carries (the adapter's settings)."""
    return dataclasses.is_dataclass(tp) or (isinstance(tp, type) and issubclass(tp, msgspec.Struct))


def _names(tp: Any) -> list[str]:
    if dataclasses.is_dataclass(tp):
        return [f.name for f in dataclasses.fields(tp)]
    return list(tp.__struct_fields__)


def _example(tp: Any, owner: type | None = None, name: str = "") -> Any:
    """One value of each type, every optional present (so nested keys are on the wire)."""
    if (owner, name) in FIXED:
        return FIXED[owner, name]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _example(next(a for a in args if a is not type(None)))
    if origin is tuple:
        if args[-1] is Ellipsis:
            return (_example(args[0]),)
        return tuple(_example(a) for a in args)
    if origin is dict:
        return {"k": _example(args[1])}
    if _is_record(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{n: _example(hints[n], tp, n) for n in _names(tp)})
    return {bool: False, int: 3, float: 0.5, str: "x"}[tp]


def _strategy(tp: Any, owner: type | None = None, name: str = "") -> st.SearchStrategy:
    if (owner, name) in CHOICES:
        return st.sampled_from(CHOICES[owner, name])
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return st.none() | _strategy(next(a for a in args if a is not type(None)))
    if origin is tuple:
        if args[-1] is Ellipsis:
            return st.lists(_strategy(args[0]), max_size=3).map(tuple)
        return st.tuples(*(_strategy(a) for a in args))
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), _strategy(args[1]), max_size=3)
    if _is_record(tp):
        hints = typing.get_type_hints(tp)
        kw = {n: _strategy(hints[n], tp, n) for n in _names(tp)}
        return st.fixed_dictionaries(kw).map(lambda k: _made(tp, k)).filter(lambda x: x is not None)
    return {
        bool: st.booleans(),
        int: st.integers(-(2**53), 2**53),
        float: st.floats(allow_nan=False, allow_infinity=False),
        str: st.text(max_size=8),
    }[tp]


def _made(cls: type, kw: dict[str, Any]) -> Any:
    try:
        return cls(**kw)
    except wire.WireError:  # a record's own invariant (e.g. needs_ttu null exactly when off)
        return None


def _json_trip(raw: Any) -> Any:
    return json.loads(json.dumps(raw, sort_keys=True))


# ---- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", wire.RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_record_round_trips_through_json(cls: type[wire.Record], data) -> None:
    rec = data.draw(_strategy(cls))
    assert cls.from_json(_json_trip(rec.to_json())) == rec


@settings(max_examples=80, deadline=None)
@given(s=_strategy(AdapterSettings))
def test_the_adapter_settings_round_trip(s: AdapterSettings) -> None:
    assert wire.settings_from_json(_json_trip(wire.settings_to_json(s))) == s


def test_the_wire_has_every_field_and_nothing_else() -> None:
    for cls in wire.RECORDS:
        raw = _example(cls).to_json()
        assert list(raw) == _names(cls), cls
    assert list(wire.settings_to_json(AdapterSettings())) == [
        f.name for f in dataclasses.fields(AdapterSettings)
    ]
    assert wire.settings_to_json(AdapterSettings())["cost"] == {
        "step_base_s": 0.01, "token_s": 0.0, "attn_pair_s": 0.0, "decode_ctx_token_s": 0.0,
    }  # fmt: skip


# ---- a key renamed on one side fails the other, naming it ---------------------------------

RENAMES = [(cls, name) for cls in wire.RECORDS for name in _names(cls)]


@pytest.mark.parametrize(("cls", "key"), RENAMES, ids=[f"{c.__name__}.{k}" for c, k in RENAMES])
def test_a_renamed_key_of_any_record_fails_naming_it(cls: type[wire.Record], key: str) -> None:
    raw = _json_trip(_example(cls).to_json())  # what the serializing side sent
    raw[f"{key}_renamed"] = raw.pop(key)
    with pytest.raises(wire.WireError) as err:
        cls.from_json(raw)
    assert str(err.value) == (
        f"{cls.WHAT}: missing keys ['{key}'], unexpected keys ['{key}_renamed']"
    )


SETTINGS_KEYS = [f.name for f in dataclasses.fields(AdapterSettings)]
COST_KEYS = [f.name for f in dataclasses.fields(CostModel)]


@pytest.mark.parametrize("key", SETTINGS_KEYS)
def test_a_renamed_adapter_setting_fails_naming_it(key: str) -> None:
    raw = _json_trip(wire.settings_to_json(AdapterSettings()))
    raw[f"{key}_renamed"] = raw.pop(key)
    with pytest.raises(wire.WireError) as err:
        wire.settings_from_json(raw, "BSRKV_TEMPOKV.adapter")
    assert str(err.value) == (
        f"BSRKV_TEMPOKV.adapter: missing keys ['{key}'], unexpected keys ['{key}_renamed']"
    )


@pytest.mark.parametrize("key", COST_KEYS)
def test_a_renamed_cost_model_key_fails_naming_it(key: str) -> None:
    raw = _json_trip(wire.settings_to_json(AdapterSettings()))
    raw["cost"][f"{key}_renamed"] = raw["cost"].pop(key)
    with pytest.raises(wire.WireError) as err:
        wire.settings_from_json(raw)
    assert str(err.value) == (
        f"adapter settings.cost: missing keys ['{key}'], unexpected keys ['{key}_renamed']"
    )


def test_a_mistyped_value_names_its_path() -> None:
    raw = _json_trip(_example(wire.UpdateRequest).to_json())
    raw["hits"]["k"]["world_size"] = "1"
    with pytest.raises(wire.WireError) as err:
        wire.UpdateRequest.from_json(raw)
    assert str(err.value) == "tempokv.update.hits.k.world_size: expected int, got '1'"
    raw = _json_trip(_example(wire.StatusReply).to_json())
    raw["claims"]["k"][0] = [0.5]
    with pytest.raises(wire.WireError) as err:
        wire.StatusReply.from_json(raw)
    assert str(err.value) == "tempokv.status.claims.k[0]: expected 2 items, got [0.5]"
    with pytest.raises(wire.WireError) as err:
        wire.settings_from_json({**wire.settings_to_json(AdapterSettings()), "k": True})
    assert str(err.value) == "adapter settings.k: expected int, got True"


# ---- the records' own rules ---------------------------------------------------------------


def test_the_records_own_rules() -> None:
    with pytest.raises(wire.WireError, match="needs_ttu is null exactly when off"):
        wire.UpdateReply({}, {}, True, True, None)
    with pytest.raises(wire.WireError, match="error is set exactly when ok is false"):
        wire.ConfigureReply(False, None, None)
    with pytest.raises(wire.WireError, match="transport: 'grpc', not connector|record"):
        wire.AdapterEnv(AdapterSettings(), "grpc", None)
    assert wire.UpdateReply.turned_off().to_json() == {
        "hit_tokens": {}, "eta_s": {}, "off": True, "needs_ttu": None, "ttu_quantile": None,
    }  # fmt: skip
    assert wire.status_from_json(wire.OFF_STATUS) is None
    status = _example(wire.StatusReply)
    assert wire.status_from_json(status.to_json()) == status


def test_an_update_goes_on_the_wire_to_the_microsecond() -> None:
    u = Update(1.23456789, ("a",), (), ("a", "b"), {"a": 0.1234567})
    hit = wire.Hit((1, 2), "", "m", 1)
    req = wire.UpdateRequest.of(u, {"a": hit})
    assert req.to_json() == {
        "at_s": 1.234568, "report": ["a"], "cancel": [], "order": ["a", "b"],
        "ttus_s": {"a": 0.123457},
        "hits": {"a": {"token_ids": [1, 2], "cache_salt": "", "model_name": "m",
                       "world_size": 1}},
    }  # fmt: skip
    assert wire.UpdateRequest.of(u).hits == {}


@pytest.mark.parametrize(
    ("bad", "at", "got"),
    [("7", 2, "'7'"), (True, 0, "True"), (1.5, 3, "1.5"), (None, 1, "None")],
)
def test_a_hits_token_list_is_read_whole_and_a_wrong_item_named(bad, at, got) -> None:
    """Token ids are read in one pass (thousands per hit, on the server's request thread);
    a wrong one is still named by its index."""
    ids = list(range(3072))
    hits = {"k": wire.Hit(tuple(ids), "", "m", 1)}
    raw = _json_trip(wire.UpdateRequest(0.0, ("k",), (), ("k",), {}, hits).to_json())
    assert wire.UpdateRequest.from_json(raw).hits["k"].token_ids == tuple(ids)
    raw["hits"]["k"]["token_ids"][at] = bad
    with pytest.raises(wire.WireError) as err:
        wire.UpdateRequest.from_json(raw)
    assert str(err.value) == f"tempokv.update.hits.k.token_ids[{at}]: expected int, got {got}"
    raw["hits"]["k"]["token_ids"] = "123"
    with pytest.raises(wire.WireError, match=r"token_ids: expected a list, got '123'"):
        wire.UpdateRequest.from_json(raw)
