"""The fault adapter's config (LMCache ``L2AdapterConfigBase``), type ``bsr_fault``.

{"inner": {...adapter spec with "type"...},   # required: bsr_fs, bsr_mooncake, fs, plugin..
 "name": "default",          # handle for run-time control (set_fault_rules(..., name))
 "control_path": "/run/faults.json",   # optional JSON file {"rules": [...]}, re-read
                             # whenever its mtime or size changes; absent file = no rules;
                             # a change seen before a task's submission applies to it
 "rules": [...],             # initial rules (see ``faults.rules``)
 "verify": false,            # a checksum at store, checked at load (any inner adapter)
 "checksum_algorithm": "xxh3_128",  # verify's algorithm: xxh3_128 | sha256 (adapters.checksum)
 "checksum_dir": null,       # where verify keeps digests (else in memory, lost at exit)
 "shape": null}              # {"bandwidth_bytes_s", "latency_s"}: each load's result is
                             # withheld until a FIFO device of that speed finished it
                             # (``bsrkv.lmcache_ext.adapters.shaping``); null: unshaped
"""

from __future__ import annotations

from lmcache.v1.distributed.l2_adapters.config import (
    L2AdapterConfigBase,
    get_l2_adapter_config_class,
)

# the inner types bsr_fs and bsr_mooncake are registered by importing their modules
from bsrkv.lmcache_ext.adapters import fs as _fs  # noqa: F401
from bsrkv.lmcache_ext.adapters import mooncake as _mooncake  # noqa: F401
from bsrkv.lmcache_ext.adapters.checksum import DEFAULT_ALGORITHM, Checksum
from bsrkv.lmcache_ext.adapters.shaping import DeviceShape
from bsrkv.lmcache_ext.faults.rules import parse_rules

TYPE_NAME = "bsr_fault"


class BsrFaultL2AdapterConfig(L2AdapterConfigBase):
    def __init__(
        self,
        inner_config: L2AdapterConfigBase,
        name: str = "default",
        control_path: str | None = None,
        rules: list[dict] | None = None,
        verify: bool = False,
        checksum_dir: str | None = None,
        shape: DeviceShape | None = None,
        checksum: Checksum | None = None,
    ) -> None:
        self.inner_config = inner_config  # wrapped adapter (name per LMCache's unwrap helper)
        self.name = name  # registry name for run-time control
        self.control_path = control_path  # JSON rules file, re-read on change
        self.rules = list(rules or [])  # initial rules (validated)
        self.verify = verify  # a checksum at store, checked at load
        self.checksum = checksum or Checksum()  # verify's algorithm
        self.checksum_dir = checksum_dir  # persisted digests for verify (else memory)
        self.shape = shape  # the device each load is paced by (None: unshaped)
        parse_rules(self.rules)

    @classmethod
    def from_dict(cls, d: dict) -> BsrFaultL2AdapterConfig:
        known = {"type", "inner", "name", "control_path", "rules", "verify", "checksum_dir"}
        known |= {"shape", "checksum_algorithm"}
        known |= {"affinity_tag", "shared", "eviction", "persist_enabled", "serde"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {TYPE_NAME} adapter fields {unknown}")
        inner = d.get("inner")
        if not isinstance(inner, dict) or not isinstance(inner.get("type"), str):
            raise ValueError("'inner' must be an adapter spec dict with a string 'type'")
        inner_cls = get_l2_adapter_config_class(inner["type"])
        inner_config = inner_cls.from_dict(inner)
        inner_config.eviction_config = cls._parse_eviction_config(inner)
        inner_config.persist_config = cls._parse_persist_config(inner)
        inner_config.serde_config = cls._parse_serde_config(inner)
        name = d.get("name", "default")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        control_path = d.get("control_path")
        if control_path is not None and not isinstance(control_path, str):
            raise ValueError("control_path must be a string")
        verify = d.get("verify", False)
        if not isinstance(verify, bool):
            raise ValueError("verify must be a boolean")
        checksum_dir = d.get("checksum_dir")
        if checksum_dir is not None and not isinstance(checksum_dir, str):
            raise ValueError("checksum_dir must be a string")
        shape = DeviceShape.parse(d.get("shape"))
        checksum = Checksum(d.get("checksum_algorithm", DEFAULT_ALGORITHM))
        return cls(
            inner_config,
            name,
            control_path,
            d.get("rules", []),
            verify,
            checksum_dir,
            shape,
            checksum,
        )

    @classmethod
    def help(cls) -> str:
        return __doc__ or ""
