"""One operator deployment (vLLM + LMCache with the BSR module, started by
``operator_stack.py``'s own command lines) shared by every attach e2e test of
tests/e2e/attach, and stopped when they are done."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
if str(HERE) not in sys.path:  # --import-mode=importlib: make attach_support importable
    sys.path.insert(0, str(HERE))

from attach_support import Deployment, operator  # noqa: E402
from operator_stack import shm_segments  # noqa: E402


@pytest.fixture(scope="package")  # stopped once tests/e2e/attach is done, not held all session
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    try:
        import bsrkv.lmcache_ext.server  # noqa: F401
    except Exception as exc:
        pytest.skip(f"bsrkv.lmcache_ext.server does not import ({exc!r})")
    from bsrctl.stack.launch import tinymodel  # the model folder an operator would have

    root = tmp_path_factory.mktemp("operator")
    state = json.loads(operator("up", str(root), "--model", str(tinymodel.build())))
    dep = Deployment(root, state)
    try:
        yield dep
    finally:
        operator("down", str(root))
        assert dep.processes() == [], f"operator parts left: {dep.processes()}"
        # its vLLM's and LMCache's /dev/shm segments (1 GiB each) went with them: every one
        # its processes made, over every restart (other stacks' run beside it)
        made = set(json.loads((root / "state.json").read_text())["segments"])
        assert made, "the operator recorded no segment of its own: the check would be empty"
        assert made & shm_segments() == set(), made & shm_segments()
