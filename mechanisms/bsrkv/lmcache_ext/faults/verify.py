"""verify: a checksum of every stored object, checked when it is loaded back."""

from __future__ import annotations

import threading
from pathlib import Path

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import _object_key_to_filename

from bsrkv.atomic import write_atomic
from bsrkv.lmcache_ext.adapters.checksum import Checksum


class Digests:
    """verify's checksum lines ("<hex> <size>") per key file name: in memory, and in
    ``<dir>/<key file>.<algorithm>`` when a checksum dir is set (they then outlive the
    process)."""

    def __init__(self, directory: Path | None, checksum: Checksum) -> None:
        self._dir = directory
        self.checksum = checksum
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._lines: dict[str, str] = {}

    def put(self, key: ObjectKey, line: str) -> None:
        name = _object_key_to_filename(key)
        with self._lock:
            self._lines[name] = line
        if self._dir is not None:
            write_atomic(self._dir / (name + self.checksum.suffix), line.encode())

    def get(self, key: ObjectKey) -> tuple[str, int] | None:
        name = _object_key_to_filename(key)
        with self._lock:
            line = self._lines.get(name)
        if line is None and self._dir is not None:
            try:
                line = (self._dir / (name + self.checksum.suffix)).read_text()
            except OSError:
                line = None
        return self.checksum.parse(line) if line else None
