"""Kernel caches on disk, so a second process (a ComfyUI restart, the next CLI run) compiles less.

``<root>`` is ``$COSMOS3_CACHE_DIR`` or ``~/.cache/cosmos3``. ``enable_persistent_caches()`` (called before the
first compile — through ``prepare_compile`` — or FlashAttention-4 import) points the caches there:

* Our compiled functions (the generation layer, the VAE decoder's stages) are saved whole, Dynamo's output
  included, in ``<root>/aot`` (``precompiled.py``): a fresh process loads them and traces nothing.
* Plain ``torch.compile`` (where torch has no AOT compile, a layer with host weight hooks, the reasoner's decode
  layer): inductor's FX-graph cache, the AOT-autograd cache and the Triton kernels they bundle live in
  ``<root>/inductor`` (``TORCHINDUCTOR_CACHE_DIR``). A fresh process that compiles the same graph loads it from there
  instead of lowering and building it again; Dynamo still traces the function and builds its guards (about a second
  per graph: neither cache covers that step). Hits need the same graph in every process, so the compiled layer is
  static-shaped except for the prompt lengths (see ``compile_generation_layers``): one graph per output shape,
  whatever the prompt, and no shape-history-dependent switch to a dynamic graph.
  Not used: ``torch.compiler.save_cache_artifacts`` / ``load_cache_artifacts`` (a portable bundle of these same
  caches, for moving them to another machine; on one machine the directory already holds them) and Dynamo's caching
  precompile (``TORCH_CACHING_PRECOMPILE``; on torch 2.14 it still traced and turned the AOT-autograd hit into a miss).
* FlashAttention-4: its CuTe-DSL kernels are JIT-compiled on first use per configuration (~2.5 s); its own
  persistent cache is switched on, in ``<root>/flash4`` (``FLASH_ATTENTION_CUTE_DSL_CACHE_*``).

* The compiler's own modules: a process's first compiled call imports about 600 modules of ``torch._dynamo``,
  Inductor, its Triton code generator and their dependencies (networkx, ``torch.ao.quantization.fx``, …), even
  when every graph is a cache hit — 2–3 s of host time on an H200 machine — and hashes torch's sources for
  Inductor's cache keys (``torch_key``, ≈ 0.1 s). ``CompilerPreload`` does both on a daemon thread, so that a
  compiled run started later finds them done. No compiling: Dynamo itself never runs on two threads (not safe in
  torch 2.11). It only pays while the main thread leaves the interpreter idle for long
  stretches: the imports hold the GIL, and a main thread that releases it often (a weight load: after every tensor
  read and copy) waits up to a switch interval (5 ms) each time to take it back, so ``Cosmos3Pipeline.load`` does not
  start it (docs/benchmark-log.md, "Loading from a warm page cache"). A host with such idle time — a ComfyUI server
  between starting and its first prompt — calls ``preload_first_run``, which also imports the modules a first
  generation imports lazily (``RUN_MODULES``: diffusers' VAE and sound decoder, the scheduler, the tokenizer), and
  ``wait_for_preload`` before each run. When its runs compile, the preload then starts Inductor's pool of compile
  worker processes (``start_compile_workers``; torch starts it only at the first compile, and the first Triton
  kernels wait while its sidecar process imports torch, Inductor and Triton and forks the workers): on an H100
  machine a first T2I step's compile took 7.9–9.2 s with torch's start, 5.5–5.8 s with the pool started 12 s
  ahead. The pool is torch's own, shared with any other compile in the process. torch stops the workers 60–90 s
  after their last job (the readiness check at their start counts as one) and forks them again from the sidecar,
  which stays, at the next compile; the sidecar holds ≈ 0.2 GiB of host memory (PSS) for the server's life, each
  worker ≈ 0.08 GiB while it runs (measured on a CPU machine). ``COSMOS3_PRESTART_COMPILE_WORKERS=0`` leaves the
  pool to torch; ``TORCH_WARM_POOL=0`` or ``TORCHINDUCTOR_COMPILE_THREADS=1`` keep it off for torch too.

Settings the user made win: a ``TORCHINDUCTOR_CACHE_DIR`` / ``TRITON_CACHE_DIR`` /
``FLASH_ATTENTION_CUTE_DSL_CACHE_*`` already in the environment is kept, and ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` /
``TORCHINDUCTOR_AUTOGRAD_CACHE=0`` keep those caches off. One exception: importing ``torch._dynamo`` writes torch's
own default (``<tmp>/torchinductor_<user>``) into ``TORCHINDUCTOR_CACHE_DIR`` (torch/_dynamo/package.py), so that
exact value is taken as unset (likewise a ``TRITON_CACHE_DIR`` that torch derived under it). Deleting ``<root>`` (or
``<root>/inductor``) clears the compile cache; the next compile rebuilds it.
"""

from __future__ import annotations

import importlib
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

_log = logging.getLogger(__name__)
_USABLE: dict[Path, Path] = {}  # the cache folder asked for -> the folder used (itself, or a temporary one)


# Entry points that pull in nearly all a first compiled run imports (checked on torch 2.11 and 2.14).
COMPILER_MODULES = (
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch._inductor.codegen.triton",
    "torch._inductor.codegen.cuda_combined_scheduling",
    "torch._inductor.runtime.triton_heuristics",
    "torch._functorch.partitioners",
    "networkx",
    "torch.distributed.tensor.experimental",
    "torch.export._trace",
)
# What a generation's first run imports where it first needs it (deferred, so that importing the package stays fast):
# the tokenizer's transformers module, the UniPC scheduler, and the Wan VAE's and the sound decoder's diffusers
# modules (which pull in most of diffusers, transformers and peft: ~800 modules, 1–2 s).
RUN_MODULES = (
    "transformers.models.auto.tokenization_auto",
    "diffusers.schedulers.scheduling_unipc_multistep",
    "diffusers.models.autoencoders.autoencoder_kl_wan",
    "diffusers.models.autoencoders.autoencoder_cosmos3_audio",
)
RECOMPILE_LIMIT = 64  # static graphs kept per compiled function and process (torch's default is 8)


def cache_root() -> Path:
    """``$COSMOS3_CACHE_DIR`` (default ``~/.cache/cosmos3``) if it can be written; else, with one warning, a
    temporary folder for this process: the compile runs, only nothing is kept for the next process."""
    want = Path(os.environ.get("COSMOS3_CACHE_DIR") or Path.home() / ".cache" / "cosmos3")
    if want not in _USABLE:
        try:
            want.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=want, prefix=".write-check-"):
                pass
            _USABLE[want] = want
        except OSError as e:
            _USABLE[want] = Path(tempfile.mkdtemp(prefix="cosmos3-cache-"))
            _log.warning("compile cache folder %s cannot be written (%s: %s); compiling into %s for this process "
                         "only (set COSMOS3_CACHE_DIR to a writable folder with free space to keep compiled graphs).",
                         want, type(e).__name__, e, _USABLE[want])
    return _USABLE[want]


def _torch_default_inductor_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


def enable_persistent_caches() -> Path:
    """Point the compile caches at ``cache_root()`` (idempotent; call before the first compile)."""
    root = cache_root()
    torch_default = _torch_default_inductor_dir()
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == torch_default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
        triton = os.environ.get("TRITON_CACHE_DIR")
        if triton is not None and os.path.abspath(triton).startswith(torch_default + os.sep):
            del os.environ["TRITON_CACHE_DIR"]  # torch derived it from its default; it re-derives it from ours
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(root / "flash4"))
    import torch._functorch.config
    import torch._inductor.config

    if "TORCHINDUCTOR_FX_GRAPH_CACHE" not in os.environ and not torch._inductor.config.fx_graph_cache:
        torch._inductor.config.fx_graph_cache = True
    if "TORCHINDUCTOR_AUTOGRAD_CACHE" not in os.environ and not torch._functorch.config.enable_autograd_cache:
        torch._functorch.config.enable_autograd_cache = True
    return root


def prepare_compile() -> None:
    """Before every run of a ``torch.compile``d function of ours (generation layer, VAE decoder stages, reasoner
    decode layer) — not only before the first: the on-disk caches (``enable_persistent_caches``), and room for
    ``RECOMPILE_LIMIT`` static graphs per compiled function (one per shape) before Dynamo would fall back to eager
    (the generation layer) or fail (the decoder's full graphs). torch ≥ 2.14 keeps these settings per context
    (``contextvars``), and ComfyUI runs every prompt in a fresh asyncio task, i.e. a copy of its worker thread's
    context: a setting made during one prompt is gone in the next. Idempotent; a setting already in place is not
    written again."""
    enable_persistent_caches()
    import torch._dynamo

    for knob in ("recompile_limit", "cache_size_limit"):  # the name differs across torch versions
        if hasattr(torch._dynamo.config, knob) and getattr(torch._dynamo.config, knob) < RECOMPILE_LIMIT:
            setattr(torch._dynamo.config, knob, RECOMPILE_LIMIT)


def _hash_torch_sources() -> None:
    """Compute Inductor's key of torch's own sources (``torch_key``: a hash of every torch source file, cached per
    process), which a process's first compile or saved graph's load otherwise computes (0.10–0.13 s on the H100
    machine)."""
    try:
        from torch._inductor.codecache import torch_key

        torch_key()
    except Exception as e:  # noqa: BLE001 — a head start only: the first compile computes it itself
        _log.debug("torch's source key was not computed ahead (%s: %s)", type(e).__name__, e)


def start_compile_workers() -> bool:
    """Start Inductor's pool of compile worker processes now rather than at the first compile (torch's own
    ``maybe_warm_pool``, which honours ``TORCH_WARM_POOL=0``, ``TORCHINDUCTOR_COMPILE_THREADS=1`` and a missing
    Triton). Whether a pool exists afterwards; never raises (a torch without it: False)."""
    try:
        from torch._inductor import async_compile

        async_compile.maybe_warm_pool()
        return bool(async_compile._pool_set)
    except Exception as e:  # noqa: BLE001 — an optional head start: the first compile starts the pool itself
        _log.debug("Inductor's compile workers were not started ahead (%s: %s)", type(e).__name__, e)
        return False


def _switch(variable: str, default: bool, what: str) -> bool:
    """A switch in the environment: ``0``/``false``/``no``/``off`` turn it off, ``1``/``true``/``yes``/``on`` on,
    unset or empty leaves ``default``; any other value leaves ``default`` with one warning naming it (``what``: the
    thing switched, as a noun phrase)."""
    value = os.environ.get(variable, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    if value:
        _log.warning("%s=%r is not a switch value; %s stays %s, the default. Set it to 1 or 0.", variable, value, what,
                     "on" if default else "off")
    return default


def prestart_compile_workers_wanted() -> bool:
    """Whether a preload for compiling runs starts the compile workers (``COSMOS3_PRESTART_COMPILE_WORKERS``, on
    when unset; ``0`` leaves them to torch's first compile)."""
    return _switch("COSMOS3_PRESTART_COMPILE_WORKERS", True, "the early start of the compile workers")


def preload_cuda_libraries_wanted() -> bool:
    """Whether a preload on a CUDA device loads the CUDA libraries a first run calls (``cuda_libraries.py``;
    ``COSMOS3_PRELOAD_CUDA_LIBRARIES=1``). Off when unset until a GPU measurement shows it pays: it runs work on the
    GPU at every server start, for every user of the pack (``bench/lent/cuda_libraries.sh`` measures it)."""
    return _switch("COSMOS3_PRELOAD_CUDA_LIBRARIES", False, "the preload's load of the CUDA libraries")


class CompilerPreload(threading.Thread):
    """Imports ``modules`` (default ``COMPILER_MODULES``) in order on a daemon thread, then, where the compiler's
    are among them, computes torch's source key and, with ``compile_workers``, points the compile caches at
    ``cache_root()`` (the workers inherit them) and starts the compile workers; last, ``load_libraries()`` where
    given (``cuda_libraries.load_cuda_libraries`` bound to the runs' device, by the host: this module does not import
    it, as it imports ``attention``, which imports this one), whose seconds ``cuda_libraries_s`` keeps.
    ``failed``: ``{module: error}`` for those that did not import (a module missing from this torch version, say);
    the run that needs one raises the real error itself. ``report``: one log line when done."""

    def __init__(self, modules: tuple[str, ...] = COMPILER_MODULES, report: bool = False,
                 compile_workers: bool = False, load_libraries: Callable[[], float] | None = None):
        super().__init__(name="cosmos3-preload", daemon=True)
        self.modules, self.report, self.compile_workers = modules, report, compile_workers
        self.load_libraries = load_libraries
        self.cuda_libraries_s: float | None = None  # how long loading the CUDA libraries took, where it ran
        self.failed: dict[str, str] = {}
        self.seconds: float | None = None  # how long the whole preload took, once done
        self.workers_started = False  # Inductor's compile worker pool was started (compile_workers asked for it)
        self.waited_out = False  # a run gave up waiting for it (wait_for_preload): later runs do not wait

    def run(self) -> None:
        start = time.perf_counter()
        for name in self.modules:
            try:
                importlib.import_module(name)
            except Exception as e:  # noqa: BLE001 — recorded; the run that needs it imports it again and reports
                self.failed[name] = f"{type(e).__name__}: {e}"
        if COMPILER_MODULES[0] in self.modules:
            _hash_torch_sources()
            if self.compile_workers:
                enable_persistent_caches()  # before the workers' sidecar starts: it inherits the cache folders
                self.workers_started = start_compile_workers()
        if self.load_libraries is not None:
            self.cuda_libraries_s = self.load_libraries()
        self.seconds = time.perf_counter() - start
        if self.report:
            compiler = ", the compiler's among them" if COMPILER_MODULES[0] in self.modules else ""
            failed = f"; {len(self.failed)} did not import, e.g. {next(iter(self.failed))}" if self.failed else ""
            workers = "; the compile workers are starting" if self.workers_started else ""
            libraries = ("" if self.cuda_libraries_s is None else
                         f"; the CUDA libraries loaded ({self.cuda_libraries_s:.2f} s of it)")
            _log.info("Cosmos3: imported what a first run needs in the background (%d of %d modules%s) in %.1f s%s%s%s",
                      len(self.modules) - len(self.failed), len(self.modules), compiler, self.seconds, failed,
                      workers, libraries)


_FIRST_RUN: list[CompilerPreload] = []
PRELOAD_WAIT_S = 120.0  # a run waits this long at most for the preload (a hung import must not hang every run)


def preload_first_run(compiles: bool, load_libraries: Callable[[], float] | None = None) -> CompilerPreload:
    """Start importing what a process's first generation imports — ``RUN_MODULES``, and ``COMPILER_MODULES`` when
    its runs compile — on a daemon thread, once per process: for a host's idle time before its first run (a
    ComfyUI server once it is up). With ``compiles`` it ends by starting Inductor's compile workers (unless
    ``COSMOS3_PRESTART_COMPILE_WORKERS=0``), having pointed the compile caches at ``cache_root()`` as the first
    compile would. Last it calls ``load_libraries`` (``cuda_libraries.load_cuda_libraries`` bound to the runs' CUDA
    device) with ``COSMOS3_PRELOAD_CUDA_LIBRARIES=1``, not yet by default. Its runs call ``wait_for_preload``
    before they start."""
    if not _FIRST_RUN:
        libraries = load_libraries if load_libraries is not None and preload_cuda_libraries_wanted() else None
        thread = CompilerPreload(RUN_MODULES + (COMPILER_MODULES if compiles else ()), report=True,
                                 compile_workers=compiles and prestart_compile_workers_wanted(),
                                 load_libraries=libraries)
        thread.start()
        _FIRST_RUN.append(thread)
    return _FIRST_RUN[0]


def wait_for_preload() -> None:
    """Return once ``preload_first_run``'s imports are done (at once when none was started, or when they are), so
    that the run does not import beside them: two threads importing the same packages can deadlock on Python's
    module locks. After ``PRELOAD_WAIT_S`` seconds the run goes on, with one warning, and later runs do not wait."""
    thread = _FIRST_RUN[0] if _FIRST_RUN else None
    if thread is not None and thread.is_alive() and not thread.waited_out:
        thread.join(PRELOAD_WAIT_S)
        if thread.is_alive():
            thread.waited_out = True
            _log.warning("Cosmos3: the background imports of a first run's modules are still running after %.0f s; "
                         "the run starts beside them.", PRELOAD_WAIT_S)
