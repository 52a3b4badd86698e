"""What experiments hold a stack to: a restore ``Target`` (``target``) and the typed measures
of its points, common and per target (``measures``), one serving ``Deployment`` whoever runs
it (``deployment``)."""
