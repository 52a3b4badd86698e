"""L2 object files are written whole (tmp + rename) and can be dropped from the page cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lmcache")

from bsrctl.stack.storage.files import drop_file_cache, write_file  # noqa: E402


@pytest.mark.parametrize("drop_cache", [False, True])
def test_write_then_drop(tmp_path: Path, drop_cache: bool) -> None:
    data = np.arange(10_000, dtype=np.uint8)
    path = tmp_path / "obj.data"
    write_file(path, data, drop_cache)
    assert path.read_bytes() == data.tobytes()
    assert [p.name for p in tmp_path.iterdir()] == ["obj.data"]  # no .tmp left
    assert drop_file_cache(path) == 1
    assert drop_file_cache(tmp_path / "missing.data") == 0
