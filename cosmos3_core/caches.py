"""Kernel caches on disk, so a second process (a ComfyUI restart, the next CLI run) does not compile again.

* ``torch.compile``: inductor's FX-graph cache and AOT-autograd cache (compiled Triton kernels and wrapper code),
  kept in ``<root>/inductor`` instead of ``/tmp/torchinductor_<user>`` (cleared at reboot);
* FlashAttention-4: its CuTe-DSL kernels are JIT-compiled on first use per configuration; its own persistent cache
  (``FLASH_ATTENTION_CUTE_DSL_CACHE_*``) is switched on, in ``<root>/flash4``.

``<root>`` is ``$COSMOS3_CACHE_DIR`` or ``~/.cache/cosmos3``. Settings the user already made in the environment win.
Dynamo still traces Python in a new process (seconds); what the cache saves is code generation and kernel builds.
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
