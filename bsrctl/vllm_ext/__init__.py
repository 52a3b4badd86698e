"""What runs inside vLLM: the TempoKV runtime adapter as a ``--scheduler-cls`` subclass of
the v1 scheduler (``scheduler``), imported only in vLLM's process; and which of its classes
a launch names (``scheduling``: vLLM's async scheduling decided from the spec, no vLLM)."""
