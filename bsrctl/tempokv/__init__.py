"""TempoKV as bsrctl runs and judges it, in one place: the run spec (``spec``,
``flash_spec``, ``serving_workload``), the simulated engine and device (``sim``), the offline
oracle (``oracle``), the serving measures as typed records (``measures``), the experiments
that run the paper's figures on the simulated and the serving stack (``experiments``) and the
summary rendered from their evidence alone (``report``). The mechanism itself (claims,
estimators, controller, provider, the wire) is ``bsrkv.tempokv``."""
