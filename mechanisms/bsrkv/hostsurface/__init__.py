"""The host surface: the vLLM and LMCache names bsrkv and bsrctl use (``declared``), read
from a package's source without importing it (``source``) and checked (``check``) by
``bsrctl doctor``, ``make compat`` and, when they load, the scheduler adapter and the
server module."""

from bsrkv.hostsurface.check import SurfaceMissing, check, require

__all__ = ["SurfaceMissing", "check", "require"]
