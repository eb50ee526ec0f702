"""``python -m cosmos3_core.gguf --checkpoint DIR --type Q8_0 --out FILE``: the GGUF converter (``cli/gguf.py``)."""

if __name__ == "__main__":
    from .cli.gguf import main

    raise SystemExit(main())
