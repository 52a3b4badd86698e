"""The nemesis soak (issue 24 item 2): only its seeded schedule exists so far."""
