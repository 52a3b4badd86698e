"""The server module's config (built from RestoreSettings) and its handler contract."""

from __future__ import annotations

import pytest

pytest.importorskip("lmcache")

from lmcache.v1.multiprocess.ext_server_module import iter_server_module_handlers  # noqa: E402
from lmcache.v1.multiprocess.modules.lmcache_driven_transfer import (  # noqa: E402
    LMCacheDrivenTransferModule,
)
from lmcache.v1.multiprocess.modules.lookup import LookupModule  # noqa: E402
from lmcache.v1.multiprocess.request_handler import iter_request_handlers  # noqa: E402

from bsrctl.errors import BadInput  # noqa: E402
from bsrkv.lmcache_ext.server import (  # noqa: E402
    BsrServerModule,
    ServerConfigError,
    ServerModuleConfig,
)
from bsrkv.restore.restorer import RestoreConfig  # noqa: E402
from bsrkv.settings import RestoreSettings  # noqa: E402

REPLACED = {
    "lookup",
    "query_prefetch_status",
    "wait_prefetch_status",
    "free_lookup_locks",
    "retrieve",
    "store",
    "end_session",
}


def test_config_defaults_and_validation() -> None:
    assert ServerModuleConfig.parse({}) == ServerModuleConfig()
    cfg = ServerModuleConfig.parse({"window_chunks": 2, "admission_budget_chunks": 4})
    assert (cfg.window_chunks, cfg.admission_budget_chunks) == (2, 4)
    with pytest.raises(ServerConfigError, match="unknown config key"):
        ServerModuleConfig.parse({"window": 2})
    with pytest.raises(ServerConfigError, match="B >= W"):
        ServerModuleConfig.parse({"window_chunks": 4, "admission_budget_chunks": 2})
    with pytest.raises(ServerConfigError, match="integer"):
        ServerModuleConfig.parse({"window_chunks": 1.5})
    with pytest.raises(ServerConfigError, match="> 0"):
        ServerModuleConfig.parse({"window_timeout_s": 0})
    assert ServerModuleConfig().retrieve_deadline_s == 45.0  # below vLLM's 60 s mq_timeout
    with pytest.raises(ServerConfigError, match="retrieve_deadline_s must be >= 0"):
        ServerModuleConfig.parse({"retrieve_deadline_s": -1})


def test_the_server_defaults_are_the_restore_settings_defaults() -> None:
    cfg = ServerModuleConfig()
    got = cfg.model_dump()
    assert got == {**RestoreSettings().model_dump(), "test_only_fail_install_window": -1}
    assert {k: got[k] for k in got if k.endswith("_s")} == {
        "window_timeout_s": 30.0,
        "probe_timeout_s": 10.0,
        "admission_timeout_s": 120.0,
        "retrieve_deadline_s": 45.0,
        "drain_timeout_s": 5.0,
        "stall_guard_s": 5.0,
    }
    assert (cfg.window_chunks, cfg.admission_budget_chunks) == (0, 0)
    core = ServerModuleConfig.parse({"window_chunks": 2, "admission_timeout_s": 7}).core_config()
    assert core == RestoreConfig(
        window_chunks=2,
        admission_budget_chunks=0,
        window_timeout_s=30.0,
        admission_timeout_s=7.0,
        retrieve_deadline_s=45.0,
        readback=True,  # the install read-back is on by default
    )
    assert ServerModuleConfig.parse({"readback": False}).core_config().readback is False


def test_config_errors_name_the_field_and_the_fix_and_are_not_the_clis() -> None:
    cases = {
        "window": "bsr server module: unknown config key(s) ['window']; valid: [",
        "1.5": "bsr server module: window_chunks must be an integer, got 1.5",
        "true": "bsr server module: window_chunks must be a number, got True",
        "str": "bsr server module: window_timeout_s must be a number, got '3'",
        "neg": "window_chunks must be >= 0, got -1",
        "zero": "window_timeout_s must be > 0, got 0.0",
        "drain": "drain_timeout_s must be >= 0, got -0.5",
        "bool": "bsr server module: checksum must be a boolean, got 'yes'",
        "bw": "admission_budget_chunks = 2 < window_chunks = 4: set B >= W",
    }
    raws = {
        "window": {"window": 2},
        "1.5": {"window_chunks": 1.5},
        "true": {"window_chunks": True},
        "str": {"window_timeout_s": "3"},
        "neg": {"window_chunks": -1},
        "zero": {"window_timeout_s": 0},
        "drain": {"drain_timeout_s": -0.5},
        "bool": {"checksum": "yes"},
        "bw": {"window_chunks": 4, "admission_budget_chunks": 2},
    }
    for case, raw in raws.items():
        with pytest.raises(ServerConfigError) as err:
            ServerModuleConfig.parse(raw)
        assert str(err.value).startswith(cases[case]), (case, str(err.value))
        assert isinstance(err.value, ValueError) and not isinstance(err.value, BadInput)
    # an integral float still fits an integer field, as JSON may send it
    assert ServerModuleConfig.parse({"window_chunks": 2.0}).window_chunks == 2
    assert ServerModuleConfig.parse({"window_timeout_s": 2}).window_timeout_s == 2.0


def test_handlers_match_the_rpc_contract_and_replace_the_builtins() -> None:
    # iter_request_handlers validates every signature against LMCache's RPC specs, as the
    # server does when it registers them; a mismatch would raise here.
    ops = {h.operation: h for h in iter_request_handlers(BsrServerModule)}
    assert set(ops) == REPLACED
    builtin = {
        h.operation: h
        for cls in (LookupModule, LMCacheDrivenTransferModule)
        for h in iter_request_handlers(cls)
    }
    for op in REPLACED:  # same thread pool as the built-in they shadow
        assert ops[op].options == builtin[op].options, op
    methods = [h.method for h in iter_server_module_handlers(BsrServerModule)]
    assert methods == sorted(
        ["bsr.configure", "bsr.fault", "bsr.forget", "bsr.holds", "bsr.markers", "bsr.peak"]
        + ["bsr.registration", "bsr.reset_peak", "bsr.status"]
        + ["tempokv.configure", "tempokv.status", "tempokv.update"]
    )
