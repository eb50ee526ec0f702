"""Ctrl-C in the command-line tools: one line on stderr and exit status 130 (the shell's code for SIGINT), from
the first line of the package that runs — never a ``KeyboardInterrupt`` traceback, never a run that goes on.

The ``python -m`` shims (``generate.py``, ``reason.py``) call ``run_cli`` before anything heavy is imported. While
the CLI's modules import (torch, diffusers, …: seconds, and nothing is written yet) a Ctrl-C ends the process at
once with the line. From the CLI's ``main`` on, Ctrl-C is remembered and raises ``KeyboardInterrupt`` where the run
is, so that it unwinds at once and removes or closes what it was writing.

Python can lose that exception: raised inside a ``__del__`` or a weakref callback it is reported ("Exception
ignored in …") and dropped, and the run goes on; raised inside code a lazy import runs through ``exec`` (a
dataclass being built) or inside a ``__set_name__`` it surfaces as another error. So the run also asks
``raise_if_interrupted`` at each progress line and before it keeps a file or prints its result, the dropped
report is not printed, and ``run_cli`` reads any end of a run after a Ctrl-C as the interruption. It then leaves
with ``os._exit(130)``: nothing is left for the interpreter's shutdown to do, and that shutdown would end the process
by a SIGINT of its own (status -2 to a parent) when the exception had passed through ``exec``, caught or not.
Stdlib only, so that importing it costs nothing.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

INTERRUPTED = "interrupted (Ctrl-C); nothing more was written."
EXIT_INTERRUPTED = 130

_state = {"open": False,  # a progress line is on stderr without its newline yet
          "requested": False}  # a Ctrl-C arrived while the CLI ran


def _exit_now(_signum, _frame) -> None:
    """SIGINT while the CLI imports: nothing to clean up, so the line and exit at once (no unwinding through
    half-imported modules)."""
    try:
        os.write(2, (INTERRUPTED + "\n").encode())
    finally:
        os._exit(EXIT_INTERRUPTED)


def _stop_requested(_signum, _frame) -> None:
    """SIGINT while the CLI runs: remember it, and stop the run where it is."""
    _state["requested"] = True
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if a Ctrl-C arrived (its first exception may have been lost; module docstring)."""
    if _state["requested"]:
        raise KeyboardInterrupt


def _report_unraisable(unraisable, report=sys.unraisablehook) -> None:
    """``sys.unraisablehook`` while the CLI runs: a Ctrl-C dropped in a ``__del__`` is not reported (the run stops
    at its next ``raise_if_interrupted``); anything else is, as Python would."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        report(unraisable)


def status_line(text: str, done: bool) -> None:
    """Rewrite the progress line on stderr (``\\r``); ``done`` ends it with a newline. A place where a run stops
    after a Ctrl-C."""
    raise_if_interrupted()
    print(f"\r{text}", end="\n" if done else "", file=sys.stderr, flush=True)
    _state["open"] = not done


def end_status_line() -> None:
    """End an open progress line, so that a message after it starts a line of its own."""
    if _state["open"]:
        print(file=sys.stderr, flush=True)
        _state["open"] = False


def _exit_interrupted() -> None:
    """The one line, and exit status 130 at once (module docstring); further Ctrl-Cs are ignored meanwhile."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_status_line()
    print(INTERRUPTED, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def run_cli(module: str, argv: list[str] | None = None) -> int:
    """Import ``cosmos3_core.cli.<module>`` and run its ``main(argv)``; Ctrl-C at any moment is one line and 130."""
    watching = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # started with Ctrl-C ignored (a background
    if watching:                                                       # job): leave it so
        signal.signal(signal.SIGINT, _exit_now)
    main = importlib.import_module(f"{__package__}.{module}").main
    try:
        if watching:  # inside the try: a Ctrl-C still pending from the imports is handled here
            sys.unraisablehook = _report_unraisable
            signal.signal(signal.SIGINT, _stop_requested)
        code = main(argv)
        raise_if_interrupted()
        if watching:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # finished: only the interpreter's shutdown is left
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or _state["requested"]:
            _exit_interrupted()
        raise
    return code
