"""TempoKV as bsrctl runs and judges it: the run spec (``spec``, ``flash_spec``,
``serving_workload``), the simulated engine and device (``sim``) and the offline oracle
(``oracle``). The mechanism itself (claims, estimators, controller, provider, the wire) is
``bsrkv.tempokv``."""
