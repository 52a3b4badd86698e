"""Stacks by stack.kind: serving (launched vLLM + LMCache [+ Mooncake]), attach, storage."""
