"""Ctrl-C in the command-line tools: one line on stderr and exit status 130 (the shell's code for SIGINT), from
the first line of the package that runs — never a ``KeyboardInterrupt`` traceback.

The ``python -m`` shims (``generate.py``, ``reason.py``) call ``run_cli`` before anything heavy is imported. While
the CLI's modules import (torch, diffusers, …: seconds, and nothing is written yet) a Ctrl-C ends the process at
once with the line. From the CLI's ``main`` on, Ctrl-C raises ``KeyboardInterrupt`` as usual, so that the run can
remove or close what it was writing (``common.run_reporting_user_errors`` prints the line); any Ctrl-C that
reaches this boundary still ends as one line and 130. Stdlib only, so that importing it costs nothing.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

INTERRUPTED = "interrupted (Ctrl-C); nothing more was written."
EXIT_INTERRUPTED = 130


def _exit_now(_signum, _frame) -> None:
    """SIGINT while the CLI imports: nothing to clean up, so the line and exit at once (no unwinding through
    half-imported modules)."""
    try:
        os.write(2, (INTERRUPTED + "\n").encode())
    finally:
        os._exit(EXIT_INTERRUPTED)


_status = {"open": False}  # a progress line is on stderr without its newline yet


def status_line(text: str, done: bool) -> None:
    """Rewrite the progress line on stderr (``\\r``); ``done`` ends it with a newline."""
    print(f"\r{text}", end="\n" if done else "", file=sys.stderr, flush=True)
    _status["open"] = not done


def end_status_line() -> None:
    """End an open progress line, so that a message after it starts a line of its own."""
    if _status["open"]:
        print(file=sys.stderr, flush=True)
        _status["open"] = False


def interrupted() -> int:
    """Print the one line and return the exit status; further Ctrl-Cs are ignored while the process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    end_status_line()
    print(INTERRUPTED, file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def run_cli(module: str, argv: list[str] | None = None) -> int:
    """Import ``cosmos3_core.cli.<module>`` and run its ``main(argv)``; Ctrl-C at any moment is one line and 130."""
    previous = signal.getsignal(signal.SIGINT)
    watching = previous is not signal.SIG_IGN  # started with Ctrl-C ignored (a background job): leave it so
    if watching:
        signal.signal(signal.SIGINT, _exit_now)
    try:
        main = importlib.import_module(f"{__package__}.{module}").main
    finally:
        if watching:
            signal.signal(signal.SIGINT, previous if callable(previous) else signal.default_int_handler)
    try:
        code = main(argv)
    except KeyboardInterrupt:
        return interrupted()
    if watching:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # finished: only the interpreter's shutdown is left
    return code
