"""Import-only stand-in for ``sgl_kernel`` so that SGLang 0.5.23 starts on a CPU-only test machine.

With ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports CPU op *names* from ``sgl_kernel`` at module import time
(``kernels/ops/kvcache/cache_move.py``: ``from sgl_kernel import copy_all_layer_kv_cache_cpu``), and no CPU
build of sgl-kernel is installable from PyPI. On a CPU without AMX the dense path calls none of these ops
(layernorm, activation and rotary take ``forward_native``), so every name here is a function that raises,
naming itself: a test that reaches one fails with the op's name instead of a wrong answer.
The hybrid (Gated DeltaNet) ops SGLang calls on CPU with no fallback have torch implementations in
``sgl_kernel.mamba`` and ``torch.ops.sgl_kernel`` (``_gdn_ops``); see docs/real-sglang.md.
Only the submodules SGLang imports without catching ImportError exist: for the others SGLang falls back.
"""

from __future__ import annotations

import logging

_log = logging.getLogger("sgl_kernel.stand_in")


class MissingKernel(RuntimeError):
    """An sgl-kernel op that has no CPU stand-in was called."""


def _missing(name: str):
    def kernel(*args, **kwargs):
        _log.error("sgl_kernel stand-in: %s called; it has no CPU implementation here", name)
        raise MissingKernel(f"sgl_kernel.{name} has no CPU implementation in the test stand-in")

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)


import sgl_kernel._gdn_ops  # noqa: E402,F401  torch.ops.sgl_kernel.*; "from . import" would hit __getattr__
