"""bsrkv's LMCache L2 adapters: ``fs`` (type ``bsr_fs``) and ``mooncake`` (``bsr_mooncake``).

Importing a module registers its type; ``checksum`` and ``fileio`` hold the helpers the
FS adapter (and the fault adapter's verify) share. This package imports nothing itself.
"""
