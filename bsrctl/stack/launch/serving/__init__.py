"""The serving stack: LMCache MP server [+ Mooncake] + vLLM OpenAI server, under supervision.

Order: (network namespace when Mooncake is on) → Mooncake master + node → LMCache server →
vLLM. The stack knows nothing of BSR: what LMCache loads beyond stock (server module, L2
adapter params) comes from the caller as ``LMCacheExtensions``
(``bsrctl.stack.launch.extensions.bsr_extensions(settings)``).

Modules: ``stack`` (ServingStack lifecycle), ``commands`` (every command line and
environment, as ``Launch``es over ``Slots``), ``client`` (HTTP calls, Completion), ``shm``
(/dev/shm bookkeeping), ``state`` (state.json, ``stack down``, port check).
"""

from bsrctl.stack.launch.serving.client import Completion, ServingClient
from bsrctl.stack.launch.serving.commands import (
    MQ_TIMEOUT_S,
    VENV_BIN,
    Launch,
    Slots,
    base_env,
    lmcache_command,
    lmcache_launch,
    reference_launch,
    vllm_command,
    vllm_env,
    vllm_launch,
)
from bsrctl.stack.launch.serving.shm import (
    SHM_PREFIXES,
    remove_unmapped_shm,
    shm_mapped,
    shm_segments,
)
from bsrctl.stack.launch.serving.stack import ServingStack
from bsrctl.stack.launch.serving.state import check_ports, start_times, stop_from_state, write_state

__all__ = [
    "MQ_TIMEOUT_S",
    "SHM_PREFIXES",
    "VENV_BIN",
    "Completion",
    "Launch",
    "ServingClient",
    "ServingStack",
    "Slots",
    "base_env",
    "check_ports",
    "lmcache_command",
    "lmcache_launch",
    "reference_launch",
    "remove_unmapped_shm",
    "shm_mapped",
    "shm_segments",
    "start_times",
    "stop_from_state",
    "vllm_command",
    "vllm_env",
    "vllm_launch",
    "write_state",
]
