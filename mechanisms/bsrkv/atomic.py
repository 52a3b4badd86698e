"""The one atomic file write: a temp file in the same folder, then rename, so a reader (or a
crash) sees the old content or the new, never half. Evidence, manifests, fault-control files
and L2 checksum sidecars all write through it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """Replace `path` with `data`. `durable`: fsync before the rename (survives power loss)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
