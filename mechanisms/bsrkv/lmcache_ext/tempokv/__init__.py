"""TempoKV's parts inside LMCache: the simulation's controller and provider over the real
``StorageManager``, and the component the server module is given.

- ``component``: ``TempoKVComponent``, the ``tempokv.*`` methods' logic and the retrieval
  hooks (gate, hold, observed stock reads, release), over what it asks of the server
  (``ServerSide``).
- ``live``: ``LiveTempo``, the loop that drives the controller and provider; ``config``: its
  settings (``LiveConfig``, read strictly).
- ``device``: staging on the DRAM tier (a LOCK prefetch; read locks are pins), progress on
  the shaped L2's schedule.
- ``flash``: staging on the flash tier (L1 a Device-DAX arena: readahead, then ``mlock``),
  with ``readahead`` (bulk reads of an arena range) and ``page_lock`` (refcounted mlocks).
- ``provider``: the provider's live addition (TTR/TTU at commit) and the pin sampler.

This ``__init__`` imports nothing; the parts stage through BSR's (``lmcache_ext.bsr``).
"""
