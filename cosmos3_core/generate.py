"""``python -m cosmos3_core.generate``: the generation CLI (``cli/main.py``)."""

from .cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
