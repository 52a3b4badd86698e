"""Per-request timelines on OpenTelemetry, the harness's side: one collector per bsrctl
process (``collect``) with its OTLP receiver and forwarder (``receiver``), the stack spec's
``trace`` field (``spec``), bsrctl's own spans (``spans``: the client's, the storage
stack's), spans to Chrome trace events and critical paths (``timeline``), and ``bsrctl
timeline`` (``command``, ``restores``). The spans the mechanisms emit inside the hosts, and
their exporter, are ``bsrkv.trace``.

Importing this package imports no OpenTelemetry SDK: only what uses it does."""
