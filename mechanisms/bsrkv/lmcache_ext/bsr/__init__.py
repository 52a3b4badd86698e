"""BSR's parts inside LMCache: the restore core's storage over LMCache, and the ``bsr.*`` wire.

- ``storage``: the core's storage protocol over a ``StorageManager`` (probe, windows, release).
- ``windows``: a window staged directly into L1 (``restore.window_staging: direct``).
- ``mp_storage``: the MP server's destination (block copies into vLLM's KV).
- ``readback``: the install read-back over LMCache's own device-to-host copy.
- ``protocol`` (over ``protocol_base``): the typed ``bsr.configure`` request and the typed
  replies of every ``bsr.*`` method, shared with the client (no LMCache or torch import).
- ``extensions``: ``bsr.*`` methods answered by components the server module does not
  import (the fault wrapper registers ``bsr.fault`` here).

This ``__init__`` imports nothing: the client imports the wire without LMCache.
"""
