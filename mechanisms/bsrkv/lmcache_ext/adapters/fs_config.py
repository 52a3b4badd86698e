"""The ``bsr_fs`` adapter's configuration: the stock FS fields plus ``load_concurrency``,
``checksum`` and ``checksum_algorithm`` (module doc of ``adapters.fs``, which re-exports it
under the ``<class_name>Config`` name the server's ``plugin`` type looks for)."""

from __future__ import annotations

import os

from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2AdapterConfig

from bsrkv.lmcache_ext.adapters.checksum import ALGORITHMS, DEFAULT_ALGORITHM, Checksum

TYPE_NAME = "bsr_fs"
ENV_LOAD_CONCURRENCY = "LMCACHE_FS_LOAD_CONCURRENCY"


def _load_concurrency_from_env() -> int:
    raw = os.environ.get(ENV_LOAD_CONCURRENCY, "1")
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_LOAD_CONCURRENCY}={raw!r}: must be a positive integer") from None
    if value < 1:
        raise ValueError(f"{ENV_LOAD_CONCURRENCY}={raw!r}: must be a positive integer")
    return value


class BsrFSL2AdapterConfig(FSL2AdapterConfig):
    """Stock FS fields (base_path, relative_tmp_dir, read_ahead_size, use_odirect) plus
    load_concurrency, checksum and checksum_algorithm."""

    def __init__(
        self,
        base_path: str,
        relative_tmp_dir: str | None = None,
        read_ahead_size: int | None = None,
        use_odirect: bool = False,
        load_concurrency: int = 1,
        checksum: bool = False,
        checksum_algorithm: str = DEFAULT_ALGORITHM,
    ):
        super().__init__(base_path, relative_tmp_dir, read_ahead_size, use_odirect)
        if isinstance(load_concurrency, bool) or not isinstance(load_concurrency, int):
            raise ValueError("load_concurrency must be a positive integer")
        if load_concurrency < 1:
            raise ValueError(f"load_concurrency must be >= 1, got {load_concurrency}")
        self.load_concurrency = load_concurrency  # threads reading load-task keys at once
        self.checksum = checksum  # write checksum sidecars at store, verify them at load
        self.checksum_algorithm = Checksum(checksum_algorithm)  # raises on an unknown name

    @classmethod
    def from_dict(cls, d: dict) -> BsrFSL2AdapterConfig:
        known = {
            "type",
            "base_path",
            "relative_tmp_dir",
            "read_ahead_size",
            "use_odirect",
            "load_concurrency",
            "checksum",
            "checksum_algorithm",
            # keys the server's generic parser handles itself
            "affinity_tag",
            "shared",
            "eviction",
            "persist_enabled",
            "serde",
        }
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown {TYPE_NAME} adapter fields {unknown}; known: {sorted(known - {'type'})}"
            )
        stock = FSL2AdapterConfig.from_dict(d)
        if "load_concurrency" in d:
            load_concurrency = d["load_concurrency"]
        else:
            load_concurrency = _load_concurrency_from_env()
        checksum = d.get("checksum", False)
        if not isinstance(checksum, bool):
            raise ValueError("checksum must be a boolean")
        return cls(
            base_path=stock.base_path,
            relative_tmp_dir=stock.relative_tmp_dir,
            read_ahead_size=stock.read_ahead_size,
            use_odirect=stock.use_odirect,
            load_concurrency=load_concurrency,
            checksum=checksum,
            checksum_algorithm=d.get("checksum_algorithm", DEFAULT_ALGORITHM),
        )

    @classmethod
    def help(cls) -> str:
        return (
            FSL2AdapterConfig.help() + "\n"
            f"- load_concurrency (int): keys read at once (default ${ENV_LOAD_CONCURRENCY} "
            "or 1)\n"
            "- checksum (bool): a checksum sidecar at store, verified at load (default false)\n"
            f"- checksum_algorithm (str): one of {list(ALGORITHMS)} (default "
            f"{DEFAULT_ALGORITHM})"
        )
