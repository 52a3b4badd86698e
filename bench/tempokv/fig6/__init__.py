"""Figure 6's bench (``bench/tempokv/fig6_serving.py``) in parts: the per-cell measures and
their summary (``cells``), where each arm's TTFT went and each request's retrieval timeline
(``where``, ``timeline``), and the flash-tier baseline's own pieces (``dax``)."""
