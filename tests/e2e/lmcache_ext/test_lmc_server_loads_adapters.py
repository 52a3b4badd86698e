"""The real ``lmcache server`` loads bsrctl's adapters through the stock ``plugin`` type.

One server, inside the Mooncake namespace, with two L2 adapters: the fault adapter over
bsrctl's FS adapter, and the Mooncake adapter. Its /status must show both, healthy, with
their own fields; the Mooncake master must count the server as a client.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from bsrctl.stack.launch.process import Supervised, pids_alive

pytestmark = pytest.mark.e2e

LMCACHE = Path(sys.executable).parent / "lmcache"


def server_argv(netns, port: int, http_port: int, adapters: list[dict]) -> list[str]:
    argv = [
        str(LMCACHE), "server",
        "--host", "127.0.0.1", "--port", str(port),
        "--l1-size-gb", "0.0625", "--no-l1-use-lazy",
        "--eviction-policy", "LRU", "--chunk-size", "256",
        "--http-host", "127.0.0.1", "--http-port", str(http_port),
        "--disable-observability", "--disable-metrics",
        "--supported-transfer-mode", "auto",
    ]  # fmt: skip
    for spec in adapters:
        argv += ["--l2-adapter", json.dumps(spec)]
    return netns.wrap(argv)


def find_adapter_statuses(doc, out: list[dict]) -> list[dict]:
    """Every dict in /status that looks like an adapter's report_status()."""
    if isinstance(doc, dict):
        if "is_healthy" in doc and "type" in doc:
            out.append(doc)
        for value in doc.values():
            find_adapter_statuses(value, out)
    elif isinstance(doc, list):
        for value in doc:
            find_adapter_statuses(value, out)
    return out


def test_lmcache_server_runs_bsr_fs_fault_and_mooncake_adapters(mooncake, netns, tmp_path):
    control = tmp_path / "faults.json"
    adapters = [
        {
            "type": "plugin",
            "module_path": "bsrkv.lmcache_ext.faults.adapter",
            "class_name": "BsrFaultL2Adapter",
            "adapter_params": {
                "name": "server-fs",
                "control_path": str(control),
                "inner": {
                    "type": "bsr_fs",
                    "base_path": str(tmp_path / "l2"),
                    "load_concurrency": 4,
                    "checksum": True,
                },
            },
        },
        mooncake.l2_adapter_config(),
    ]
    port, http_port = netns.free_port(), netns.free_port()
    server = Supervised(
        name="lmcache",
        argv=server_argv(netns, port, http_port, adapters),
        log_path=tmp_path / "lmcache.log",
        env={"LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"},
    )
    server.start()
    try:
        t0 = time.monotonic()
        health = f"http://127.0.0.1:{http_port}/healthcheck"
        server.wait_healthy(lambda: netns.http_ok(health), timeout_s=90.0, interval_s=0.5)
        ready_s = time.monotonic() - t0
        res = netns.http_get(f"http://127.0.0.1:{http_port}/status", 10.0)
        assert res is not None and res[0] == 200, res
        statuses = find_adapter_statuses(json.loads(res[1]), [])
        by_type = {s["type"]: s for s in statuses}
        assert "BsrFSL2Adapter" in by_type, statuses
        assert "BsrMooncakeL2Adapter" in by_type, statuses
        fs = by_type["BsrFSL2Adapter"]
        assert fs["is_healthy"] is True
        assert (fs["load_concurrency"], fs["checksum"]) == (4, True)
        assert fs["bsr_fault"]["name"] == "server-fs"
        assert fs["bsr_fault"]["pump_alive"] is True
        mc = by_type["BsrMooncakeL2Adapter"]
        assert mc["is_healthy"] is True
        assert mc["master_server_address"] == mooncake.endpoints.master_address
        metrics = netns.http_get(mooncake.endpoints.metrics_url)
        assert metrics is not None
        assert "master_active_clients" in metrics[1].decode()
        print(f"lmcache server with bsrctl adapters healthy after {ready_s:.1f} s")
    finally:
        pids = [server.pid, *server.descendants()]
        server.stop(timeout_s=15.0)
    assert pids_alive([p for p in pids if p]) == []
