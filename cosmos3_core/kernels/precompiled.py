"""Compiled functions kept on disk whole, Dynamo's output with them, so that a restarted process loads them instead
of tracing them again.

``torch.compile``'s own on-disk caches (``caches.py``) hold the kernels, but every new process still runs Dynamo
over the function to rebuild the graph and its guards before it can look them up: 1.4–1.5 s for the VAE decoder's
six stage graphs at 256p on an H200 (docs/benchmark-log.md), more than the kernels' cache load. torch's AOT compile
(``torch.compile(fn, fullgraph=True).aot_compile(example)``, ``save_compiled_function``,
``torch.compiler.load_compiled_function``; experimental, present from torch 2.11) serializes the traced bytecode,
its guards and the compiled graph with its kernels. Loading one takes about 0.1 s.

``compile_missing=False`` compiles nothing: a signature whose file is on disk loads it, any other runs ``fn`` as is
(for a function whose compile costs more than it saves in one run, used compiled once some run has compiled it).

``PrecompiledFunction(fn)`` is called like ``fn`` (positional arguments: tensors, lists of tensors, modules whose
parameters are the graph's inputs, Python scalars that select the graph). Per *call signature* (every tensor's
shape, strides, dtype and device, every module's class, parameter metadata and the source of its classes, every
scalar) it keeps one full graph, static but for ``dynamic_dims``:

* in memory after the first call with that signature;
* on disk as ``<cache root>/aot/<function>-<digest>.bin``, ``<function>`` named from this package's root
  (``cosmos3_core.model.transformer.generation_layer``) whatever name a host imported the package under (ComfyUI
  imports a custom node under its folder's path: ``portable_name``); the digest covers the signature, the grad /
  inference mode, the caller's ``key_extra()`` (process settings the graph bakes in, such as the attention route),
  every source file of ``cosmos3_core`` (torch's loader checks no source: a graph of older code would run), the
  backend, the versions of torch, Triton and diffusers, and the GPU. A new signature
  compiles and saves its file; an existing file is loaded. A graph whose guards differ from those on disk for the
  same digest (state the signature cannot describe, such as which attributes a host wrote onto a module) is kept
  beside them (``<function>-<digest>.<i>.bin``, up to ``VARIANTS`` per digest), never in their place.

``dynamic_dims(args)`` names ``(tensor, dim)`` pairs compiled as dynamic sizes (a prompt's length, a frame's height
and width): they are left out of the signature (but for sizes 0 and 1, which Dynamo specializes), so one graph
serves every size there. ``aot_allowed(args)`` (checked on every call) sends a call to plain ``torch.compile``
instead, whose in-process guards cover what a saved artifact's cannot: a host's per-call weight hooks (ComfyUI's
LoRA-on-the-fly and weight streaming), which are Python functions.

Every call checks the artifact's guards (tensor metadata, parameter metadata, the scalars); a call that fails
those of every graph held for it loads or compiles another instead of running a graph made for other inputs. A
file that does not load (written by another torch, cut short) is replaced. Where torch has no AOT compile, or it
fails for a function, that function runs through plain ``torch.compile`` and the reason is logged: same results,
only the restart is slower.

The files are pickles that this package writes into its own cache folder, read back by the same user: the trust
model of torch's own compile caches there (which pickle too). Nothing downloaded is ever loaded this way.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib.metadata
import inspect
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from .caches import cache_root, prepare_compile

_log = logging.getLogger(__name__)
VARIANTS = 4  # graphs kept on disk per call signature whose guards differ (see ``PrecompiledFunction.variants``)
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # cosmos3_core/: the code a compiled graph may inline
# What a host put in front of this package's own module names: ComfyUI imports a custom-node folder under its path
# (``/…/custom_nodes/<pack>``, dots written ``_x_``), so the core is ``/…/custom_nodes/<pack>.cosmos3_core``.
HOST_PREFIX = __name__.removesuffix("cosmos3_core.kernels.precompiled")


class CompileError(ValueError):
    """torch.compile could not compile a function of ours: the run stops with this one message; nothing is left
    half made (the next run, compiled or eager, starts clean)."""


def raise_compile_failure(e: BaseException, name: str) -> None:
    """Raise ``CompileError`` for ``e`` if it is the compiler's own failure (a backend or Inductor error)."""
    from torch._dynamo.exc import BackendCompilerFailed

    failures: tuple[type, ...] = (BackendCompilerFailed,)
    try:
        from torch._inductor.exc import InductorError

        failures += (InductorError,)
    except ImportError:  # a torch without it
        pass
    if isinstance(e, failures):
        inner = getattr(e, "inner_exception", None) or e  # BackendCompilerFailed wraps the backend's own error
        text = str(inner).strip()
        first = f"{type(inner).__name__}: {text.splitlines()[0][:300]}" if text else type(inner).__name__
        raise CompileError(f"compile: torch.compile failed for {name.rsplit('.', 1)[-1]} ({first}); set compile to "
                           "'off' (CLI: --compile off) to run eagerly.") from e


def aot_supported() -> bool:
    """Whether this torch can save and load Dynamo's output (``torch._dynamo.config.enable_aot_compile``)."""
    import torch._dynamo.config  # here, not at import: the compiler's modules load on first use (caches.py)

    return hasattr(torch._dynamo.config, "enable_aot_compile") and hasattr(torch.compiler, "load_compiled_function")


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """What the traced code is: every source file of this package (a graph inlines code from several of them) and
    the versions of torch, Triton and diffusers (whose VAE modules the decoder stages read)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        h.update(path.relative_to(PACKAGE_ROOT).as_posix().encode() + path.read_bytes())
    for dist in ("torch", "triton", "diffusers"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=-".encode())
    return h.hexdigest()


def portable_name(module: str, qualname: str) -> str:
    """``module.qualname`` without the host's ``HOST_PREFIX``, as a file name may hold it: a host's path must not
    become part of a cache file's name (an absolute path would put the file beside the pack instead of in the
    cache) nor of a cache key (a moved install would compile everything again)."""
    if HOST_PREFIX and module.startswith(HOST_PREFIX):
        module = module[len(HOST_PREFIX):]
    return re.sub(r"[^\w.-]", "_", f"{module}.{qualname}")


_MISPLACED = re.compile(r"cosmos3_core\.[\w.]+-[0-9a-f]{24}(\.\d+)?\.bin")


@functools.lru_cache(maxsize=None)
def remove_misplaced_files() -> int:
    """Delete the graph files whose name is the host's absolute module path (``<HOST_PREFIX>cosmos3_core.<function>
    -<digest>[.<i>].bin``: a name not made by ``portable_name``, which the cache folder's path cannot hold, so the
    file sits where that path points — ComfyUI's ``custom_nodes`` folder, or for an install path with dots a folder
    named after it with ``_x_`` for each dot — and nothing reads it); how many. Once per process; a file that cannot
    be deleted is left, with one warning."""
    if not os.path.isabs(HOST_PREFIX):
        return 0
    folder, start = os.path.split(HOST_PREFIX)
    removed = 0
    for path in Path(folder).glob(f"{glob.escape(start)}cosmos3_core.*.bin"):
        if not _MISPLACED.fullmatch(path.name[len(start):]):
            continue
        try:
            path.unlink(missing_ok=True)
            removed += 1
        except OSError as e:
            _log.warning("could not remove %s, a compiled graph kept outside the cache (%s); delete it by hand.",
                         path, e)
    if removed:
        _log.info("removed %d compiled-graph file(s) kept in %s instead of the cache %s", removed, folder,
                  cache_root() / "aot")
    return removed


@functools.lru_cache(maxsize=None)
def _class_source(cls: type) -> str:
    """A module class by name and the digest of its source file (a host's own layer classes, diffusers' VAE
    blocks: code outside this package that a trace inlines)."""
    try:
        digest = hashlib.sha256(Path(inspect.getsourcefile(cls) or "").read_bytes()).hexdigest()[:16]
    except (OSError, TypeError):
        digest = "?"
    return f"{portable_name(cls.__module__, cls.__qualname__)}:{digest}"


def _describe(value: Any, dynamic: frozenset = frozenset()) -> Any:
    """A hashable description of one argument: what a static full graph of it depends on (an inference tensor is
    another kind of input to Dynamo). A tensor with dimensions in ``dynamic`` (``(id(tensor), dim)``) is described
    without those sizes (but for 0 and 1, which Dynamo specializes) and by its layout (contiguous, channels-last)
    instead of its strides (which follow the sizes)."""
    if isinstance(value, torch.Tensor):
        dims = {d for i, d in dynamic if i == id(value)}
        if dims:
            shape = tuple(None if d in dims and n >= 2 else n for d, n in enumerate(value.shape))
            layout = (value.is_contiguous(),
                      value.ndim == 5 and value.is_contiguous(memory_format=torch.channels_last_3d),
                      value.ndim == 4 and value.is_contiguous(memory_format=torch.channels_last))
            return ("T", shape, layout, str(value.dtype), str(value.device), value.requires_grad, value.is_inference())
        return ("T", tuple(value.shape), tuple(value.stride()), str(value.dtype), str(value.device),
                value.requires_grad, value.is_inference())
    if isinstance(value, torch.nn.Module):
        params = tuple((n, tuple(p.shape), tuple(p.stride()), str(p.dtype), str(p.device))
                       for n, p in value.named_parameters())
        classes = sorted({_class_source(type(m)) for m in value.modules()})  # the forwards a trace may inline
        return ("M", type(value).__qualname__, params, tuple(classes))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v, dynamic) for v in value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("S", repr(value))
    raise TypeError(f"PrecompiledFunction: unsupported argument type {type(value).__name__}.")


def _fast_key(args: tuple, dynamic: frozenset) -> tuple:
    """The in-memory key: like ``_describe`` but a module counts by its class only (its parameters' metadata is
    checked by the compiled function's guards on every call), so one graph serves every layer of a stack."""
    out = [torch.is_grad_enabled(), torch.is_inference_mode_enabled()]
    for a in args:
        if isinstance(a, torch.nn.Module):
            out.append(("M", type(a).__qualname__))
        else:
            out.append(_describe(a, dynamic))
    return tuple(out)


def _guard_failure(fn, args: tuple) -> str:
    """Why ``fn``'s guards reject ``args`` (best effort: the reason's text is torch-internal)."""
    try:
        return str(fn._artifacts.guard_manager.check_verbose(fn.prepare_f_locals(*args)))[:500]
    except Exception as e:  # noqa: BLE001
        return f"reason unavailable: {type(e).__name__}"


class PrecompiledFunction:
    """``fn`` as one static full graph per call signature, loaded from ``cache_root()/aot`` when a process before
    this one compiled it (see the module docstring). ``backend``: the ``torch.compile`` backend."""

    def __init__(self, fn: Callable, *, backend: str = "inductor", fullgraph: bool = True,
                 dynamic_dims: Callable[[tuple], list[tuple[torch.Tensor, int]]] | None = None,
                 key_extra: Callable[[], Any] | None = None, aot_allowed: Callable[[tuple], bool] | None = None,
                 compile_missing: bool = True):
        self.fn, self.backend, self.fullgraph = fn, backend, fullgraph  # fullgraph: of the plain path (AOT needs it)
        self.dynamic_dims, self.key_extra, self.aot_allowed = dynamic_dims, key_extra, aot_allowed
        self.name = portable_name(fn.__module__, fn.__qualname__)
        self._by_key: dict[tuple, list[Callable]] = {}
        self._plain: Callable | None = None  # torch.compile(fn): calls AOT compile cannot or may not serve
        self._aot_failed = False  # AOT compile raised for this function once: plain torch.compile from then on
        self.compile_missing = compile_missing  # False: a signature with no file on disk runs ``fn`` eagerly
        # artifacts loaded from / written to disk by this object, signatures run eagerly (for tests, benches)
        self.loaded = self.compiled = self.eager = 0

    def __call__(self, *args):
        if self.aot_allowed is not None and not self.aot_allowed(args):
            return self._plain_call(*args)
        dynamic = frozenset((id(t), d) for t, d in self._dims(args))
        try:
            key = (_fast_key(args, dynamic), self.key_extra() if self.key_extra else None)
        except TypeError:  # an argument this cache cannot describe (a parallel group, say): plain torch.compile
            return self._plain_call(*args)
        fns = self._by_key.setdefault(key, [])
        for f in fns:  # the graphs this object holds for such calls: the first whose guards pass runs
            if not hasattr(f, "guard_check") or f.guard_check(*args):
                return f(*args)
        f = self._get(args, dynamic)
        fns.append(f)
        return f(*args)

    # ------------------------------------------------------------------ internals
    def _dims(self, args: tuple) -> list[tuple[torch.Tensor, int]]:
        return self.dynamic_dims(args) if self.dynamic_dims is not None else []

    def _mark(self, args: tuple) -> None:
        """Mark the dynamic sizes for a compile. Only then: a loaded artifact's guards (torch 2.14) take a tensor
        that carries Dynamo's dimension marks for one that the compile did not see marked, and fail."""
        for t, d in self._dims(args):
            torch._dynamo.maybe_mark_dynamic(t, d)

    def _plain_call(self, *args):
        if self._plain is None:
            self._plain = torch.compile(self.fn, dynamic=False, fullgraph=self.fullgraph, backend=self.backend)
        self._mark(args)
        try:
            return self._plain(*args)
        except Exception as e:
            raise_compile_failure(e, self.name)
            raise

    def path(self, args: tuple, dynamic: frozenset = frozenset()) -> Path:
        """The artifact file for a call with ``args``."""
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        text = repr((self.name, code_digest(), self.backend, device, torch.is_grad_enabled(),
                     torch.is_inference_mode_enabled(), self.key_extra() if self.key_extra else None,
                     _describe(args, dynamic)))
        digest = hashlib.sha256(text.encode()).hexdigest()[:24]
        return cache_root() / "aot" / f"{self.name}-{digest}.bin"

    def variants(self, args: tuple, dynamic: frozenset = frozenset()) -> list[Path]:
        """The files that may hold a graph for a call with ``args``: ``path()`` and up to ``VARIANTS - 1`` more
        (``<name>-<digest>.<i>.bin``) for graphs whose guards differ on state the signature cannot see (which
        attributes a host wrote onto a module, say), so that neither one replaces the other on disk."""
        first = self.path(args, dynamic)
        return [first] + [first.with_name(f"{first.stem}.{i}{first.suffix}") for i in range(1, VARIANTS)]

    def _get(self, args: tuple, dynamic: frozenset) -> Callable:
        prepare_compile()
        remove_misplaced_files()
        unavailable = self._aot_failed or not aot_supported()
        paths = [] if unavailable else self.variants(args, dynamic)
        on_disk = [p for p in paths if p.exists()]
        if not self.compile_missing and not on_disk:
            self.eager += 1
            return self.fn
        if unavailable:
            return self._plain_call
        misfits: list[str] = []  # why each graph on disk does not fit this call
        free = [p for p in paths if p not in on_disk]
        for path in on_disk:
            loaded, misfit = self._load(path, args)
            if loaded is not None:
                return loaded
            if misfit is None:  # unreadable: its slot is taken again
                free.insert(0, path)
            else:
                misfits.append(misfit)
        target = free[0] if free else paths[-1]
        if misfits:
            _log.warning("%s: no graph kept on disk for this call fits its inputs (%s); compiling another, kept as %s.",
                         self.name, misfits[0], target.name)
        return self._compile(args, dynamic, target)

    def _load(self, path: Path, args: tuple) -> tuple[Callable | None, str | None]:
        """``(graph, None)``: the graph in ``path``, whose guards pass ``args``; ``(None, why)``: it loaded but does
        not fit them; ``(None, None)``: the file does not load (logged)."""
        try:
            with open(path, "rb") as f:
                loaded = torch.compiler.load_compiled_function(f, f_globals=self.fn.__globals__)
            loaded.disable_guard_check()  # checked in __call__ before every call instead (no double check)
        except Exception as e:  # noqa: BLE001 — another torch's file, or one cut short: rebuilt by the caller
            _log.warning("%s: could not load %s (%s: %s); compiling it again.", self.name, path, type(e).__name__, e)
            return None, None
        if loaded.guard_check(*args):
            self.loaded += 1
            return loaded, None
        return None, f"{path.name}: {_guard_failure(loaded, args)}"

    def _compile(self, args: tuple, dynamic: frozenset, path: Path) -> Callable:
        try:
            # ``dynamic=False`` would specialize the marked sizes too. Exactly the marked sizes are dynamic: no
            # automatic dynamic shapes (which would follow what this process compiled before), and no duck sizing
            # (two dynamic sizes equal in this call, two prompts of one length, stay two sizes).
            from torch.fx.experimental import _config as fx_config  # (an ``import torch.…`` here would shadow torch)

            with torch._dynamo.config.patch(enable_aot_compile=True, automatic_dynamic_shapes=False), \
                    fx_config.patch(use_duck_shape=False):
                compiled = torch.compile(self.fn, dynamic=None if dynamic else False, fullgraph=True,
                                         backend=self.backend)
                self._mark(args)
                aot = compiled.aot_compile((args, {}))
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                aot.save_compiled_function(os.fspath(path))
            except OSError as e:  # a full or read-only disk: the graph runs, a new process compiles it again
                _log.warning("%s: could not keep the compiled graph in %s (%s: %s); it is used, but a new process "
                             "compiles it again.", self.name, path, type(e).__name__, e)
                path.unlink(missing_ok=True)  # never a file cut short
            aot.disable_guard_check()
            self.compiled += 1
            return aot
        except Exception as e:  # noqa: BLE001 — same graph through plain torch.compile, only the restart is slower
            _log.warning("%s: AOT compile unavailable (%s: %s); using torch.compile, which re-traces the function in "
                         "every new process.", self.name, type(e).__name__, str(e)[:300])
            self._aot_failed = True
            return self._plain_call
