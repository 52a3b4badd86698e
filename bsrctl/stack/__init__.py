"""The stacks bsrctl measures, by lifecycle:

- ``contracts``: what experiments hold a stack to (``Target``; its measures per point,
  ``RestoreMeasures`` and each target's own ``ServingMeasures`` / ``StorageMeasures``;
  ``Deployment``);
- ``launch``: a deployment bsrctl starts and stops by PID (the serving stack's processes,
  Mooncake, namespaces, the flash tier, the model, the device profile, ``stack up/down/
  status/plan``);
- ``attach``: a deployment bsrctl did not start, and what it must offer first;
- ``measure``: what is read on a running deployment (seeding, tiers, canonical outputs and
  the reference vLLMs, the restore pool, the serving restore target);
- ``doctor``: what this machine has for a stack;
- ``storage``: LMCache's StorageManager in-process, no model (the storage target);
- ``selector``: ``stack.kind`` picks the deployment and the target.
"""
