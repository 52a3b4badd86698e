"""Stacks bsrctl drives: serving (real vLLM + LMCache [+ Mooncake]), storage, sim."""
