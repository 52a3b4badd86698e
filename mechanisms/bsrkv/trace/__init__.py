"""The spans bsrkv's own code emits inside LMCache and vLLM, and their OTLP exporter
(``spans``). Collecting them, the run's timeline and the stack spec's ``trace`` field belong
to the harness that launches the hosts."""
