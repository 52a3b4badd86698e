"""The in-process server fixture, defined once beside bsrkv's own server tests (importing it
also makes ``bsr_inprocess`` importable as a top-level module)."""

from tests.bsrkv.lmcache_ext.server.conftest import bsr_sm_server  # noqa: F401
