"""An in-process BSR server module over LMCache's real StorageManager, for the fast tests.

A real ``MPCacheServerContext`` (real L1, a real filesystem L2 behind bsrctl's fault
adapter), the built-in lookup and transfer modules and the BSR module, no transport.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lmcache.v1.distributed.api import AttnWindowDesc, MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.config import add_storage_manager_args, parse_args_to_config
from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey
from lmcache.v1.multiprocess.engine_context import MPCacheServerContext
from lmcache.v1.multiprocess.ext_server_module import ExtServerModuleBuildContext
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import (
    LMCacheDrivenTransferModule,
)
from lmcache.v1.multiprocess.modules.lookup import LookupModule

import bsrkv.lmcache_ext.faults.adapter  # noqa: F401  registers bsr_fault, bsr_fs
from bsrkv.lmcache_ext.server import build_server_modules
from bsrkv.restore.plan import confirm_plan
from bsrkv.restore.types import RestoreRequest, RowId, RowKeys, Window

TOKEN = "in-process-control-token"  # every InProcessServer's unless a test sets its own
CHUNK = 16  # tokens per chunk
MODEL = "bsr-unit-model"
LAYOUT = MemoryLayoutDesc(shapes=[torch.Size([2, 2, CHUNK, 64])], dtypes=[torch.float32])
C_BYTES = 2 * 2 * CHUNK * 64 * 4  # one chunk of the single row (rank 0, group 0)


def authed(body: dict[str, Any] | None = None, token: str = TOKEN) -> bytes:
    """A mutating method's payload carrying the control token."""
    return json.dumps({**(body or {}), "control_token": token}).encode()


class InProcessServer:
    """A real MPCacheServerContext + built-in modules + the BSR module, no transport."""

    def __init__(
        self, tmp: Path, l1_bytes: int, config: dict[str, Any], name: str, devdax: bool = False
    ) -> None:
        """``devdax``: the whole L1 is an arena file of ``l1_bytes`` (LMCache's Device-DAX L1,
        ``--l1-devdax-path``), as the flash tier runs it."""
        self.fault_name = name
        self.l2_dir = tmp / "l2"
        adapter = {
            "type": "bsr_fault",
            "name": name,
            "inner": {"type": "bsr_fs", "base_path": str(self.l2_dir)},
        }
        parser = argparse.ArgumentParser()
        add_storage_manager_args(parser)
        args = parser.parse_args(
            [
                "--l1-size-gb",
                str(l1_bytes / 2**30),
                "--eviction-policy",
                "LRU",
                "--l2-adapter",
                json.dumps(adapter),
                *self._devdax(tmp, l1_bytes, devdax),
            ]
        )
        if devdax:
            args.shm_name = ""  # the MP server's --shm-name "": a Device-DAX L1 has no SHM
        self.ctx = MPCacheServerContext(parse_args_to_config(args), chunk_size=CHUNK)
        self.sm = self.ctx.storage_manager
        self.lookup_mod = LookupModule(self.ctx)
        self.transfer_mod = LMCacheDrivenTransferModule(self.ctx)
        self.ctx.layout_desc_registry.register(
            MODEL, 1, LAYOUT, AttnWindowDesc([-1]), group_layout_descs={0: LAYOUT}
        )
        build = ExtServerModuleBuildContext(
            server_context=self.ctx,
            mp_config=None,  # type: ignore[arg-type]
            coordinator_config=None,  # type: ignore[arg-type]
            modules=(self.lookup_mod, self.transfer_mod),
            config={"control_token": TOKEN, **config},
        )
        self.module = build_server_modules(build)

    @staticmethod
    def _devdax(tmp: Path, l1_bytes: int, on: bool) -> list[str]:
        if not on:
            return []
        tmp.mkdir(parents=True, exist_ok=True)
        arena = tmp / "arena"
        with arena.open("wb") as f:
            f.truncate(l1_bytes)  # pre-sized: LMCache maps l1_bytes of it
        return ["--l1-devdax-path", str(arena), "--no-l1-use-lazy"]

    def store(self, tokens: list[int]) -> None:
        """Every chunk written into L1 (and through to L2), kept in L1: the flash tier's
        documents, which live in the arena."""
        for key in self.keys_for(tokens):
            self._write(key)

    def _write(self, key: ObjectKey) -> bytes:
        """One chunk of random bytes written into L1 (and through to L2); its bytes."""
        obj = self.sm.reserve_write([key], LAYOUT)[key]
        raw = obj.raw_tensor.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
        self.sm.finish_write([key])
        return bytes(raw.numpy().tobytes())

    def close(self) -> None:
        self.transfer_mod.close()
        self.ctx.close()

    def l1_used(self) -> int:
        return int(self.sm.get_l1_usage()[0])

    def keys_for(self, tokens: list[int]) -> list[ObjectKey]:
        hashes = self.ctx.token_hasher.compute_chunk_hashes(tokens)
        rank = ObjectKey.ComputeKVRank(1, 0, 1, 0)
        return [ObjectKey(h, MODEL, rank, 0) for h in hashes]

    def seed(self, tokens: list[int]) -> list[bytes]:
        """Store every chunk (L1 + L2 write-through) one at a time, then empty L1."""
        keys = self.keys_for(tokens)
        payloads = []
        for i, key in enumerate(keys):
            payloads.append(self._write(key))
            deadline = time.monotonic() + 20
            while self._l2_files() < i + 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert self._l2_files() == i + 1, "L2 write-through did not complete"
            self.forget()
        return payloads

    def _l2_files(self) -> int:
        return len(list(self.l2_dir.glob("*.data")))

    def forget(self) -> None:
        out = json.loads(self.module.bsr_forget(authed({"wait_s": 10})))
        assert out["l1_used_bytes_after"] == 0, out

    def lookup(self, tokens: list[int], rid: str) -> int:
        key = IPCCacheServerKey(
            model_name=MODEL,
            world_size=1,
            worker_id=None,
            token_ids=tuple(tokens),
            start=0,
            end=len(tokens) // CHUNK * CHUNK,
            request_id=rid,
            num_kv_readers=1,
        )
        self.module.lookup(key, 1)
        got = self.module.wait_prefetch_status(rid, 10.0)
        assert got is not None
        return int(got)


class VerifyingDestination:
    """Installs nothing; checks each window's bytes against what was stored."""

    def __init__(self, payloads: list[bytes], fail_window: int = -1) -> None:
        self.payloads = payloads
        self.fail_window = fail_window
        self.installed: list[int] = []
        self.invalid = False

    def install(self, request_id: str, window: Window, objects: Any, num_chunks: int) -> int:
        if window.index == self.fail_window:
            raise RuntimeError("install fault")
        total = 0
        for objs in objects.values():
            for i, obj in enumerate(objs[:num_chunks]):
                chunk = window.chunk_start + i
                got = obj.raw_tensor.view(torch.uint8).numpy().tobytes()
                assert got == self.payloads[chunk], f"chunk {chunk} differs"
                self.installed.append(chunk)
                total += obj.get_size()
        return total

    def sync(self, request_id: str) -> None:
        return None

    def mark_invalid(self, request_id: str) -> None:
        self.invalid = True


def restore(server: InProcessServer, tokens: list[int], rid: str, dest: Any) -> Any:
    keys = server.keys_for(tokens)
    req = RestoreRequest(rid, (RowKeys(RowId(0, 0), tuple(keys), C_BYTES),), CHUNK)
    plan = confirm_plan(req, [(True,) * len(keys)])
    return server.module.restorer.restore(plan, dest)


def make_tokens(num_chunks: int, salt: int = 0) -> list[int]:
    return [(7 * i + salt) % 1000 + 2 for i in range(num_chunks * CHUNK + 5)]


def private_dir(prefix: str) -> Path:
    """A directory of our own: pytest's basetemp is rotated by concurrent pytest runs."""
    return Path(tempfile.mkdtemp(prefix=prefix))
