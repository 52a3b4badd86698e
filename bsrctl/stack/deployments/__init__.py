"""The serving ``Deployment`` (``bsrctl.stack.contracts.deployment``) two ways: launched by
bsrctl, every process by PID (``launched``), or the operator's, reached over its endpoints
(``attached``)."""
