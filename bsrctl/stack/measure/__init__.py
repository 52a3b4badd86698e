"""What bsrctl reads on a running deployment: seeding until the tiers hold a prompt
(``seeding``), what each tier holds (``tiers``), canonical outputs on reference vLLMs
(``canonical_outputs``, ``reference_pool``), the BSR restore pool (``bsr_client``,
``readback``), the machine's room for L1 (``machine``), and the serving restore target
(``target``)."""
