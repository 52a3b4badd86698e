"""bsrkv: bounded-state restoration (BSR) and TempoKV staging, as they run inside LMCache and vLLM.

- ``restore``: bounded-state restoration's pure core (discover the whole hit, restore it in
  windows of at most W chunks, fail closed).
- ``lmcache_ext``: BSR and TempoKV inside LMCache's MP server (``lmcache_ext.server``, loaded
  with ``--server-module``), its L2 adapters and the fault-injecting adapter.
- ``vllm_ext``: TempoKV's scheduler adapter inside vLLM's engine core.
- ``tempokv``: TempoKV's claims, estimators, controller and provider, and its wire.

It imports only what LMCache or vLLM already bring (and xxhash); the harness that
qualifies them is a distribution of its own, never imported here.
"""

__version__ = "0.1.0"
