"""The host surface: the vLLM and LMCache names bsrkv uses (``declared``), read
from a package's source without importing it (``source``) and checked (``check``) by
the harness's doctor, ``make compat`` and, when they load, the scheduler adapter and the
server module."""

from bsrkv.hostsurface.check import SurfaceMissing, check, require

__all__ = ["SurfaceMissing", "check", "require"]
