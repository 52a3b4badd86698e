"""A deployment bsrctl did not start (``stack.kind: attach``): its spec and endpoints
(``stack``), the ``Deployment`` over it (``deployment``) and what it must offer before
anything is measured (``prerequisites``)."""
