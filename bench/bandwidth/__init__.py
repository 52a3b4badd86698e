"""bench/restore_bandwidth.py's parts, by tier: ``common`` (samples, round-robin rounds, the
results table), ``stacks`` (deploying the bench's storage stacks, one restore, the lookup
comparison), ``raw`` (threads reading L2 files), ``fs`` (the FS tier), ``mooncake`` (the
Mooncake tier: store, namespace, the worker process) and ``mooncake_worker`` (what the worker
measures inside the store's namespace), ``summary`` (the last line)."""
