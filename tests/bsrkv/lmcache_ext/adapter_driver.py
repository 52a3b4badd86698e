"""Runs lmcext_kv steps in a separate process (inside a network namespace), one JSON per line.

Usage: nsenter -t <holder> -n -- python adapter_driver.py
stdin: {"op": "init", "adapters": [spec...], "l1_bytes": N, "chunk_bytes": C}
       {"op": "store", "salt": s, "n": n} | {"op": "forget", "salt": s, "n": n}
       {"op": "prefetch", "salt": s, "n": n, "timeout_s": t}
       {"op": "lookup" | "load", "salt": s, "n": n}: adapter-level, bypassing L1
       {"op": "fault", "control": {...}}: faults.control.handle_control in this process
       {"op": "mc_corrupt", "salt": s, "n": n, "index": i}: flip a byte inside Mooncake
       {"op": "status"} | {"op": "close"}
stdout: one JSON reply per command: {"ok": true, ...} or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict

import lmcext_kv as kv
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

import bsrkv.lmcache_ext.faults.adapter  # noqa: F401  registers bsr_fs, bsr_mooncake, bsr_fault
from bsrkv.lmcache_ext.adapters.mooncake import mooncake_key
from bsrkv.lmcache_ext.faults.control import handle_control


def main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # library prints must not corrupt the protocol
    sm = None
    chunk_bytes = 0
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "init":
                configs = [
                    get_l2_adapter_config_class(spec["type"]).from_dict(spec)
                    for spec in req["adapters"]
                ]
                t0 = time.monotonic()
                sm = kv.build_sm(configs, req["l1_bytes"])
                chunk_bytes = req["chunk_bytes"]
                reply = {"init_s": time.monotonic() - t0}
            elif op == "store":
                keys = kv.make_keys(req["n"], req["salt"])
                reply = {"store_s": kv.store(sm, keys, chunk_bytes, req.get("timeout_s", 30.0))}
            elif op == "forget":
                kv.forget(sm, kv.make_keys(req["n"], req["salt"]))
                reply = {"l1_used": sm.get_l1_usage()[0]}
            elif op == "prefetch":
                keys = kv.make_keys(req["n"], req["salt"])
                fetch = kv.prefetch(sm, keys, chunk_bytes, req.get("timeout_s", 30.0))
                reply = asdict(fetch)
                reply["digests"] = {str(k): v for k, v in fetch.digests.items()}
                reply["l1_used_after"] = sm.get_l1_usage()[0]
            elif op == "lookup":
                keys = kv.make_keys(req["n"], req["salt"])
                t0 = time.monotonic()
                reply = {
                    "present": kv.adapter_lookup(kv.adapters(sm)[0], keys),
                    "elapsed_s": time.monotonic() - t0,
                }
            elif op == "load":
                keys = kv.make_keys(req["n"], req["salt"])
                loaded, exact, elapsed = kv.adapter_load(kv.adapters(sm)[0], keys, chunk_bytes)
                reply = {"loaded": loaded, "exact": exact, "elapsed_s": elapsed}
            elif op == "fault":  # run-time control of a bsr_fault adapter in this process
                reply = json.loads(handle_control(json.dumps(req["control"])))
                if not reply.pop("ok"):
                    raise RuntimeError(reply["error"])
            elif op == "mc_corrupt":  # flip one byte of a stored object inside Mooncake itself
                adapter = kv.adapters(sm)[0]
                adapter = getattr(adapter, "inner", adapter)
                key = kv.make_keys(req["n"], req["salt"])[req["index"]]
                name = mooncake_key(key, adapter._config.key_prefix)
                data = bytearray(adapter._store.get(name))
                data[req.get("offset", 0)] ^= 0xFF
                reply = {"upsert": adapter._store.upsert(name, bytes(data)), "size": len(data)}
            elif op == "status":
                reply = {"status": [a.report_status() for a in kv.adapters(sm)]}
            elif op == "close":
                if sm is not None:
                    sm.close()
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            reply["ok"] = True
        except Exception as exc:
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply, default=str) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
