"""``python -m cosmos3_core.reason``: the reasoner CLI (``cli/reason.py``)."""

from .cli.reason import main

if __name__ == "__main__":
    raise SystemExit(main())
