"""What runs in (or next to) an LMCache 0.5.6 process, one package per part.

- ``server``: the ``--server-module`` (probe-only lookup, windowed retrieve, ``bsr.*`` and
  ``tempokv.*`` methods); the only part that composes the others.
- ``bsr``: BSR's parts (the restore core's storage over LMCache, window staging, the
  install read-back) and the ``bsr.*`` wire (typed request and replies, no LMCache import).
- ``tempokv``: TempoKV's parts (the live controller and provider, its devices on the DRAM
  and flash tiers, the server module's TempoKV component).
- ``adapters``: the L2 adapters ``bsr_fs`` and ``bsr_mooncake``.
- ``faults``: the fault-injecting L2 wrapper ``bsr_fault`` (qualification machinery).
"""
