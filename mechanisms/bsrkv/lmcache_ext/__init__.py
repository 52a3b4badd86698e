"""bsrctl inside LMCache 0.5.6: what runs in (or next to) an LMCache process.

- ``server``: the ``--server-module`` (probe-only lookup, windowed retrieve, ``bsr.*``).
- ``protocol``: the typed ``bsr.*`` replies, shared with the client (no lmcache import).
- ``storage``, ``mp_storage``: the restore core's storage over a ``StorageManager``.
- ``adapters``: L2 adapters ``bsr_fs`` and ``bsr_mooncake``.
- ``faults``: the fault-injecting L2 wrapper ``bsr_fault`` (qualification machinery).
- ``extensions``: ``bsr.*`` methods answered by components the server module does not import.
"""
