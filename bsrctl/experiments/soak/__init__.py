"""`bsrctl soak`, the nemesis soak: spec, seeded schedule, run (load, faults, quiesce), checker."""
