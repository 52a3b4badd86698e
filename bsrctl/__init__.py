"""bsrctl: qualify KV-cache restoration (BSR, TempoKV) on a real serving stack."""

__version__ = "0.1.0"
