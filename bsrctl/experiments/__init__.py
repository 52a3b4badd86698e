"""Experiments: each drives a stack through the small protocol and writes evidence."""
