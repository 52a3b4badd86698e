"""bsr.holds: the prompt's leading whole chunks each L2 adapter holds, by the adapters' own
lookup-and-lock (then unlock), for LMCache's stock adapters as for bsrctl's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from bsrkv.lmcache_ext.bsr.protocol import HoldsReply
from bsrkv.lmcache_ext.server import holds
from bsrkv.lmcache_ext.server.holds import l2_holds, leading_whole


@pytest.mark.parametrize(
    ("found", "rows", "held"),
    [
        (set(range(8)), [8], 8),
        ({0, 1, 2, 4}, [8], 3),  # chunk 3 missing: only the prefix before it counts
        (set(range(8)) - {5 + 4}, [4, 4], 4),  # the second row (rank 1) misses nothing of 0..3
        (set(range(8)) - {4 + 1}, [4, 4], 1),  # rank 1 misses chunk 1
        (set(), [4, 4], 0),
        (set(), [], 0),
    ],
)
def test_leading_whole(found: set[int], rows: list[int], held: int) -> None:
    assert leading_whole(found, rows) == held


class Adapter:
    """An L2 adapter answering a lookup with the keys it holds; records unlocks."""

    def __init__(self, has: set[str], polls_before_done: int = 0) -> None:
        self.has, self.unlocked, self.wait = has, [], polls_before_done

    def submit_lookup_and_lock_task(self, keys: list[str], layouts: Any) -> list[str]:
        return keys

    def query_lookup_and_lock_result(self, task: list[str]) -> Any:
        if self.wait:
            self.wait -= 1
            return None
        idx = [i for i, k in enumerate(task) if k in self.has]
        return SimpleNamespace(get_indices_list=lambda: idx)

    def submit_unlock(self, keys: list[str]) -> None:
        self.unlocked.append(keys)


def ctx_with(*adapters: Adapter, layouts: Any = "L") -> Any:
    registry = SimpleNamespace(
        find_group_layout_descs=lambda m, w: layouts, find_attn_desc=lambda m, w: "A"
    )
    sm = SimpleNamespace(l2_adapters=lambda: [(None, a) for a in adapters])
    return SimpleNamespace(layout_desc_registry=registry, token_hasher="H", storage_manager=sm)


def test_every_adapter_is_looked_up_and_unlocked(monkeypatch: pytest.MonkeyPatch) -> None:
    # two ranks x 3 chunks: keys "r<rank>c<chunk>"
    rows = [SimpleNamespace(keys=[f"r{r}c{c}" for c in range(3)]) for r in range(2)]
    seen: list[tuple] = []

    def resolve(hasher, model, world, ids, salt, layouts, attn):
        seen.append((hasher, model, world, tuple(ids), salt, layouts, attn))
        return rows, 3

    monkeypatch.setattr(holds, "resolve_grouped_object_keys", resolve)
    fs = Adapter({"r0c0", "r0c1", "r0c2", "r1c0", "r1c1", "r1c2"}, polls_before_done=2)
    other = Adapter({"r0c0", "r1c0", "r0c1"})
    reply = l2_holds(ctx_with(fs, other), {"model_name": "m", "world_size": 2, "token_ids": [1]})
    assert reply == HoldsReply(3, (3, 1), "")
    assert seen == [("H", "m", 2, (1,), "", "L", "A")]
    assert fs.unlocked == [["r0c0", "r0c1", "r0c2", "r1c0", "r1c1", "r1c2"]]
    assert other.unlocked == [["r0c0", "r0c1", "r1c0"]]  # what it locked, nothing more
    assert HoldsReply.from_json(reply.to_json()) == reply


def test_an_unregistered_model_is_an_answer_not_an_exception() -> None:
    reply = l2_holds(ctx_with(Adapter(set()), layouts={}), {"model_name": "m", "token_ids": []})
    assert reply == HoldsReply(0, (), "no layout registered for 'm' world_size=1")
