"""What experiments hold a stack to: a restore ``Target`` and its typed measures
(``target``), one serving ``Deployment`` whoever runs it (``deployment``)."""
