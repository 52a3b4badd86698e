"""Restore experiments on any Target: capacity ladder, window sweep, capacity law."""
