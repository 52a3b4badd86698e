"""The live registration (what the engine registered with LMCache) in ``Registration.
geometry()`` form, so derived, live and stored compare tensor by tensor.

vLLM 0.32 registers every attention layer as one 4-D view ``[B, H, N, C]`` with K and V
packed in the content axis (``vllm/v1/kv_cache_interface.py:319-441``,
``create_kv_cache_views``; C = head_size + head_size_v, MLA has head_size_v = 0 and H = 1).
LMCache 0.5.6's detector maps every such rank-4 view to a fused K/V format
(``NL_X_NB_BS_NH_CS`` / ``NL_X_NB_NH_BS_CS``, ``lmcache/v1/gpu_connector/kv_format/
detectors/vllm.py:62-90``; only a uint8 plane 132 wide, the DSA indexer, is told apart) and
stores it as one plane of ``H * C`` per token (``multiprocess/transfer_context/
worker_transfer.py:828-836``: "single-plane (kv_size == 1) covers MLA and fused-K/V
formats"). vLLM 0.32's ``LMCacheMPConnector`` sends no ``use_mla`` with the registration
(``register_kv_caches(kv_caches)``, ``vllm/distributed/kv_transfer/kv_connector/v1/
lmcache_mp_connector.py:543-553``; the layout hints carry only ``kv_layout``,
``lmcache/integration/vllm/utils.py:43-49``), so neither side can tell an MLA latent from
the K/V of one head by its shape: the server module reads a fused plane as K/V
``(2, T, H, C / 2)`` (``lmcache_ext/server/layout.py``). The bytes are the same; which one
it is follows from the model, which the client knows: a single-head fused plane whose
width equals the latent the derived registration expects there is that latent ``(T, C)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bsrkv.registration import Registration


def fused_plane_width(shape: Sequence[int]) -> int | None:
    """The content width of a single-head fused plane read as K/V ``(2, T, 1, C / 2)``."""
    if len(shape) == 4 and shape[0] == 2 and shape[2] == 1:
        return 2 * int(shape[3])
    return None


def live_shape(shape: Sequence[int], expected: tuple[int, ...] | None) -> tuple[int, ...]:
    """A live per-chunk shape in the derived convention: a single-head fused plane of the
    width of an expected latent ``(T, C)`` is that latent; everything else as read."""
    shape = tuple(int(d) for d in shape)
    width = fused_plane_width(shape)
    if width is not None and expected is not None and expected == (shape[1], width):
        return expected
    return shape


def live_geometry(expected: Registration, tensors: Sequence[Any]) -> tuple[str, ...]:
    """``geometry()`` strings of one engine instance's live tensors (``LiveTensor``: index,
    shape, dtype, group), each read against the expected tensor at its position."""
    want = [t.shape for t in expected.tensors]
    return tuple(
        f"kv[{t.index}]={list(live_shape(t.shape, want[i] if i < len(want) else None))} "
        f"{t.dtype} g{t.group}"
        for i, t in enumerate(tensors)
    )
