"""``python -m cosmos3_core.generate``: the generation CLI (``cli/main.py``); Ctrl-C from the first moment is one
line and exit status 130 (``cli/interrupt.py``)."""

if __name__ == "__main__":
    from .cli.interrupt import run_cli

    raise SystemExit(run_cli("main"))

from .cli.main import main  # noqa: E402 — imported as a module: the CLI's entry point

__all__ = ["main"]
