"""What runs inside vLLM: the TempoKV runtime adapter as a ``--scheduler-cls`` subclass of
the v1 scheduler (``scheduler``, ``transport``, ``step_trace``). Imported only in vLLM's process."""
