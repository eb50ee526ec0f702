"""Kernel caches on disk, so a second process (a ComfyUI restart, the next CLI run) compiles less.

* FlashAttention-4: its CuTe-DSL kernels are JIT-compiled on first use per configuration (~2.5 s); its own
  persistent cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_*``) is switched on, in ``<root>/flash4``. Measured on an H200
  (BENCHMARKS.md, run 8): a fresh process's first FlashAttention-4 step cost 0.13 s more than a steady one.
* ``torch.compile``: inductor's FX-graph and AOT-autograd caches are switched on, in ``<root>/inductor`` instead of
  ``/tmp/torchinductor_<user>`` when ``TORCHINDUCTOR_CACHE_DIR`` is still unset (on the lent H200 it was already set
  by the time this ran, so the cache stayed in /tmp). Not shown to pay yet: a fresh process still spent 14 s
  compiling 480p, because the first process had moved on to a dynamic-shape graph and the fresh one asked for a
  static one (BENCHMARKS.md).

``<root>`` is ``$COSMOS3_CACHE_DIR`` or ``~/.cache/cosmos3``. Settings the user already made in the environment win.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("COSMOS3_CACHE_DIR") or Path.home() / ".cache" / "cosmos3")


def enable_persistent_caches() -> Path:
    """Point the compile caches at ``cache_root()`` (idempotent; call before the first compile)."""
    root = cache_root()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(root / "flash4"))
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    return root
