"""``bsrctl timeline`` (``command``): a run's per-request critical paths. The spans, the
OTLP receiver and collector and the timeline model are the mechanisms' (``bsrkv.trace``)."""
