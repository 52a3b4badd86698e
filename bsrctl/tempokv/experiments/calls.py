"""The ``tempokv.*`` calls a serving run makes on the server module, typed by the TempoKV
wire: the config comes from the run's spec (its deployment's chunk size, L1, the shaped
L2's rate), and every reply is read back with ``from_json`` (a key renamed on the server
is a StackFailed naming it, never a silent 0)."""

from __future__ import annotations

from typing import Any, Protocol

from bsrctl.errors import StackFailed
from bsrctl.tempokv.spec import TempoKVSpec
from bsrkv.tempokv import wire

MIB = 1 << 20


class ModuleClient(Protocol):
    def call(self, method: str, payload: dict[str, Any] | None = None) -> dict[str, Any]: ...


def tempo_config(spec: TempoKVSpec, policy: str) -> wire.TempoConfig:
    """The controller and provider of one policy on the run's deployment. On the flash
    tier the provider models the fast tier (its capacity), its TTR prior is the flash rate
    (the throttle's) and staging is mlock of arena ranges (``tier: dax``)."""
    run, ft = spec.serving, spec.serving.fast_tier
    return wire.TempoConfig(
        policy=policy,
        capacity_bytes=run.stack.lmcache.l1_size_bytes if ft is None else ft.fast_tier_bytes,
        budget_bytes=int(run.budget_mib * MIB),
        concurrency=1,  # the shaped L2 (the throttled flash) is one FIFO device
        prior_bytes_s=run.l2_bandwidth_mib_s * MIB if ft is None else ft.flash_bytes_s,
        prior_latency_s=run.l2_latency_s if ft is None else 0.0,
        static_rate_bytes_s=None,  # TempoKV-Static stages at the prior
        tick_s=spec.control.tick_s,
        chunk_tokens=run.stack.lmcache.chunk_size,
        tier="l2" if ft is None else "dax",
    )


def _read(method: str, read: Any, raw: dict[str, Any]) -> Any:
    try:
        return read(raw)
    except wire.WireError as exc:
        raise StackFailed(f"LMCache {method} answered an unexpected shape: {exc}") from None


def configure(client: ModuleClient, config: wire.TempoConfig | None) -> wire.ConfigureReply:
    """(Re)start TempoKV with ``config`` (None: off); a refusal is a StackFailed."""
    raw = client.call(wire.CONFIGURE, wire.ConfigureRequest(config).to_json())
    got: wire.ConfigureReply = _read(wire.CONFIGURE, wire.ConfigureReply.from_json, raw)
    if not got.ok:
        what = config.policy if config is not None else "off"
        raise StackFailed(f"{wire.CONFIGURE} {what}: refused: {got.error}")
    return got


def status(client: ModuleClient) -> wire.StatusReply | None:
    """The live report (None: TempoKV is off)."""
    raw = client.call(wire.STATUS, {})
    return _read(wire.STATUS, wire.status_from_json, raw)  # type: ignore[no-any-return]
