"""The LMCache e2e modules' fixtures, defined once beside the unit tests that use them too:
the network namespace and Mooncake store (tests/bsrctl/mechanisms/lmcache_ext), and
``bsr_inprocess`` importable as a top-level module (tests/bsrkv/lmcache_ext/server)."""

import tests.bsrkv.lmcache_ext.server.conftest  # noqa: F401
from tests.bsrctl.mechanisms.lmcache_ext.conftest import (  # noqa: F401
    mooncake,
    netns,
    netns_support,
)
