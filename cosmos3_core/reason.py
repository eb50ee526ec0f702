"""``python -m cosmos3_core.reason``: the reasoner CLI (``cli/reason.py``); Ctrl-C from the first moment is one
line and exit status 130 (``cli/interrupt.py``)."""

if __name__ == "__main__":
    from .cli.interrupt import run_cli

    raise SystemExit(run_cli("reason"))

from .cli.reason import main  # noqa: E402 — imported as a module: the CLI's entry point

__all__ = ["main"]
