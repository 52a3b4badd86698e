"""The Mooncake tier: a master + storage node in a private network namespace, and one worker
process per size inside it (``restore_bandwidth.py --mooncake-worker``, which runs
``mooncake_worker``); its table lines are said here, its result is its last JSON line."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import GIB, Say, TierResult
from .stacks import registration

ENTRY = Path(__file__).resolve().parents[1] / "restore_bandwidth.py"


def worker_argv(args: argparse.Namespace, master: str, tokens: int) -> list[str]:
    """The worker's command line: this run's flags for one size."""
    sweep = args.mc_load_workers_sweep if tokens == min(args.tokens) else []
    return [
        sys.executable, str(ENTRY), "--mooncake-worker", master,
        "--tokens", str(tokens),
        "--windows", *map(str, args.windows),
        "--repeat", str(args.repeat),
        "--mc-whole-max-gib", str(args.mc_whole_max_gib),
        "--mc-parallel", *map(str, args.mc_parallel),
        "--conc", str(args.mc_load_workers),
        "--mc-load-workers-sweep", *map(str, sweep),
    ]  # fmt: skip


def read_worker(stdout: str, say: Say) -> TierResult | None:
    """Say the worker's lines; its result is the last line that is a JSON object."""
    res = None
    for line in stdout.splitlines():
        if line.startswith("{"):
            res = TierResult.from_json(json.loads(line))
        else:
            say(line)
    return res


def mooncake_tier(args: argparse.Namespace, say: Say) -> list[TierResult]:
    """Start a Mooncake master + node in a private namespace; measure inside it."""
    from bsrctl.stack.launch.netns import start_netns
    from bsrctl.stack.launch.serving.mooncake import start_mooncake

    reg = registration()
    need = max(reg.num_chunks(t) for t in args.tokens) * reg.bytes_per_chunk * reg.tp_size
    segment = need + GIB
    log_dir = Path(tempfile.mkdtemp(prefix="bsr-bench-mc-", dir=args.root))
    ns = start_netns(log_dir, "bench-netns")
    results: list[TierResult] = []
    try:
        mc = start_mooncake(ns, log_dir, segment_size=str(segment), health_timeout_s=60.0)
        try:
            for tokens in args.tokens:
                say(
                    f"## Mooncake, {tokens} tokens: store segment {segment / GIB:.1f} GiB "
                    f"(TCP over the namespace's loopback), client in the namespace"
                )
                argv = worker_argv(args, mc.endpoints.master_address, tokens)
                proc = subprocess.run(
                    ns.wrap(argv), capture_output=True, text=True, timeout=args.mc_timeout_s
                )
                res = read_worker(proc.stdout, say)
                if proc.returncode != 0 or res is None:
                    tail = "\n".join(proc.stderr.splitlines()[-15:])
                    raise SystemExit(f"mooncake worker failed ({proc.returncode}):\n{tail}")
                results.append(res)
        finally:
            mc.stop(timeout_s=10.0)
    finally:
        ns.stop()
        shutil.rmtree(log_dir, ignore_errors=True)
    return results
