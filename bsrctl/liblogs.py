"""Library logs (LMCache, vLLM, Mooncake) go to files in the run folder, never the console.

LMCache's loggers write to a ``StreamHandler`` bound to ``sys.stderr`` *when each logger is
created* (lazily, module by module, ``propagate=False``). So whether a line reached the
console depended on which module was imported first and under which ``sys.stderr`` (a
``CliRunner``'s, in the tests). ``capture()`` makes it deterministic: every library logger,
existing or created later, gets one routing handler instead of its console handler. The
router writes to ``<run>/logs/<library>.log`` while a run folder is attached (``into``) and
keeps a bounded backlog otherwise, flushed into the next run folder attached.

The serving stack's processes write their own logs under ``<run>/stack/`` (stdout and
stderr of each process go to a file there).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LIBRARIES = ("lmcache", "vllm", "mooncake")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s (%(filename)s:%(lineno)d)"
BACKLOG = 5000  # records kept while no run folder is attached


def _library(name: str) -> str | None:
    top = name.split(".", 1)[0]
    return top if top in LIBRARIES else None


class _Router(logging.Handler):
    """One handler for every library logger: to the attached run folder, else a backlog."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.files: dict[str, logging.FileHandler] = {}
        self.folder: Path | None = None
        self.backlog: deque[logging.LogRecord] = deque(maxlen=BACKLOG)
        self.guard = threading.RLock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            if self.folder is None:
                self.backlog.append(record)
                return
            self._file(_library(record.name) or "other").emit(record)

    def _file(self, library: str) -> logging.FileHandler:
        handler = self.files.get(library)
        if handler is None:
            assert self.folder is not None
            self.folder.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(self.folder / f"{library}.log", encoding="utf-8")
            handler.setFormatter(logging.Formatter(FORMAT))
            self.files[library] = handler
        return handler

    def attach(self, folder: Path) -> None:
        with self.guard:
            self.detach()
            self.folder = folder
            while self.backlog:
                self.emit(self.backlog.popleft())

    def detach(self) -> None:
        with self.guard:
            for handler in self.files.values():
                handler.close()
            self.files.clear()
            self.folder = None


ROUTER = _Router()


class _RoutedLogger(logging.Logger):
    """A library logger never gets a console handler: the router stands in for it."""

    def addHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802 - logging's name
        if _library(self.name) and _console(hdlr):
            hdlr = ROUTER
        if hdlr not in self.handlers:
            super().addHandler(hdlr)


def _console(handler: logging.Handler) -> bool:
    """A handler that writes to a stream other than a file of its own (stderr, stdout)."""
    return type(handler) is logging.StreamHandler


_installed = False


def capture() -> None:
    """Route every library logger, those that exist and those created later (idempotent)."""
    global _installed
    with ROUTER.guard:
        if not _installed:
            base = logging.getLoggerClass()
            if not issubclass(base, _RoutedLogger):
                logging.setLoggerClass(_RoutedLogger)
            _installed = True
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if isinstance(logger, logging.Logger) and _library(name):
                _reroute(logger)
        # vLLM's root logger config and LMCache's own checks find the name: pin it too.
        for library in LIBRARIES:
            _reroute(logging.getLogger(library))


def _reroute(logger: logging.Logger) -> None:
    consoles = [h for h in logger.handlers if _console(h)]
    for handler in consoles:
        logger.removeHandler(handler)
    if consoles or logger.name in LIBRARIES:
        if ROUTER not in logger.handlers:
            logging.Logger.addHandler(logger, ROUTER)
        logger.propagate = False  # never on to the root logger's last-resort stderr handler


@contextmanager
def into(run_dir: Path) -> Iterator[Path]:
    """While inside, library logs land in ``run_dir/logs/<library>.log``."""
    capture()
    folder = Path(run_dir) / "logs"
    ROUTER.attach(folder)
    try:
        yield folder
    finally:
        ROUTER.detach()
