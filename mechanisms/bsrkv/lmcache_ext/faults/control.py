"""Run-time control of the fault adapters of this process, and their control file.

In process: ``set_fault_rules``, ``clear_fault_rules``, ``fault_stats`` over the live
adapters by name, and ``handle_control`` (bytes in, bytes out: ``{"op": "set"|"clear"|
"stats"|"list", "name": .., "rules": [..]}``), which the adapter registers as the server
module's ``bsr.fault`` method. Across processes: ``write_control_file``, re-read by an
adapter whose ``control_path`` names it. No lmcache import here.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Protocol

from bsrkv.lmcache_ext.faults.rules import FaultRule, parse_rules, rules_of_control_doc


class ControlledAdapter(Protocol):
    def set_rules(self, rules: list[dict]) -> None: ...

    def stats(self) -> dict: ...


_LIVE: dict[str, weakref.ReferenceType[ControlledAdapter]] = {}
_LIVE_LOCK = threading.Lock()


def register_live(name: str, adapter: ControlledAdapter) -> bool:
    """Make ``adapter`` the one control reaches by ``name``; False if it displaced one."""
    with _LIVE_LOCK:
        old = _LIVE.get(name)
        _LIVE[name] = weakref.ref(adapter)
    return old is None or old() is None


def unregister_live(name: str, adapter: ControlledAdapter) -> None:
    with _LIVE_LOCK:
        ref = _LIVE.get(name)
        if ref is not None and ref() is adapter:
            del _LIVE[name]


def _live(name: str) -> ControlledAdapter:
    with _LIVE_LOCK:
        ref = _LIVE.get(name)
        names = sorted(_LIVE)
    adapter = ref() if ref else None
    if adapter is None:
        raise KeyError(f"no live fault adapter named {name!r}; live: {names}")
    return adapter


def fault_adapter_names() -> list[str]:
    with _LIVE_LOCK:
        return sorted(n for n, r in _LIVE.items() if r() is not None)


def set_fault_rules(rules: list[dict], name: str = "default") -> None:
    _live(name).set_rules(rules)


def clear_fault_rules(name: str = "default") -> None:
    _live(name).set_rules([])


def fault_stats(name: str = "default") -> dict:
    return _live(name).stats()


def handle_control(payload: bytes) -> bytes:
    """Bytes in, bytes out (JSON), for a ``server_module_handler``; never raises."""
    try:
        req = json.loads(payload or b"{}")
        op = req.get("op", "stats")
        name = req.get("name", "default")
        if op == "set":
            set_fault_rules(req.get("rules", []), name)
        elif op == "clear":
            clear_fault_rules(name)
        elif op == "list":
            return json.dumps({"ok": True, "names": fault_adapter_names()}).encode()
        elif op != "stats":
            raise ValueError(f"op {op!r}: expected set, clear, stats or list")
        return json.dumps({"ok": True, "stats": fault_stats(name)}).encode()
    except Exception as exc:  # a raising handler hangs vLLM: report instead
        return json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode()


CONTROL_FILE_MODE = 0o600  # whoever can write it arms faults in the server: its owner only


def write_control_file(path: str | Path, rules: list[dict]) -> None:
    """Atomically (re)write a control file, mode 0600 whatever the umask (a temp file created
    with that mode, then renamed over the old one); the adapter re-arms for the next task
    submitted."""
    parse_rules(rules)  # refuse to write what the adapter would reject
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}-{os.getpid()}-{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, CONTROL_FILE_MODE)
    try:
        os.fchmod(fd, CONTROL_FILE_MODE)  # O_CREAT's mode is masked by the umask: no wider
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps({"rules": rules}).encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ControlFile:
    """A JSON rules file (``{"rules": [...]}``), re-read whenever its mtime or size changes;
    an absent file means no rules. Not thread-safe: the adapter calls it under its lock."""

    def __init__(self, path: Path, log: Any) -> None:
        self.path = path
        self._log = log
        self._sig: tuple[int, int] | None = None

    def changed_rules(self) -> list[FaultRule] | None:
        """The file's rules if it changed since the last call, else None (a file that
        cannot be read or parsed is logged and its change ignored: the rules are kept)."""
        try:
            st = self.path.stat()
            sig: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            sig = None
        except OSError as exc:
            self._log.error("fault control file %s unreadable, rules kept: %s", self.path, exc)
            return None
        if sig == self._sig:
            return None
        self._sig = sig
        try:
            return [] if sig is None else rules_of_control_doc(json.loads(self.path.read_text()))
        except (OSError, ValueError) as exc:
            self._log.error("fault control file %s rejected, rules kept: %s", self.path, exc)
            return None
