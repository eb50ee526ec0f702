"""``python -m cosmos3_core.tiny``: writes a tiny random checkpoint (a test fixture, ``testing/tiny.py``)."""

from .testing.tiny import main

if __name__ == "__main__":
    main()
