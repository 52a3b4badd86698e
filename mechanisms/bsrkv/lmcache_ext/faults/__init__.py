"""The fault-injecting L2 adapter (type ``bsr_fault``), TEST and qualification machinery.

- ``rules``: FaultRule, parse_rules, decide (pure).
- ``control``: run-time control of this process's live adapters (set_fault_rules,
  clear_fault_rules, fault_stats, handle_control) and write_control_file (no lmcache).
- ``config``: BsrFaultL2AdapterConfig. ``adapter``: BsrFaultL2Adapter (+ ``pump``, ``verify``).

LMCache loads it with ``"module_path": "bsrkv.lmcache_ext.faults.adapter",
"class_name": "BsrFaultL2Adapter"``. The server module never imports this package: the
adapter registers ``bsr.fault`` in ``bsrkv.lmcache_ext.bsr.extensions`` when it is imported.
"""
