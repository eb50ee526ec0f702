"""The GGUF converter's command line: ``python -m cosmos3_core.gguf --checkpoint DIR --type Q8_0 --out FILE``.

Writes ``DIR/transformer`` (a Hub-layout Cosmos3 checkpoint) as one GGUF file (``model/gguf_write.py`` says what
goes in it); load it with the same checkpoint folder for the VAE, tokenizer and configs (CLI ``--gguf FILE``,
ComfyUI: Load Cosmos3 Checkpoint's ``gguf`` input). ``--checkpoint`` is the checkpoint folder or its
``transformer/`` folder. ``--out`` is checked before anything is read: a new name (or ``--force``) ending in
``.gguf``, in a folder that exists and can be written (a missing folder is named with the fix, never created). A
user mistake exits with one ``error:`` line and status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import CheckpointError
from ..model.gguf_write import WRITABLE, write_gguf
from .common import check_writable


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cosmos3_core.gguf", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True,
                   help="local Cosmos3 checkpoint folder (Hub layout, bf16), or its transformer/ folder")
    p.add_argument("--type", required=True, choices=WRITABLE,
                   help="GGML type of the decoder layers' linear weights (Q8_0 ≈ half of bf16, Q4_0 ≈ a quarter)")
    p.add_argument("--out", required=True, help="the .gguf file to write (e.g. models/diffusion_models/…gguf)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return p


def check_out(out: Path, force: bool) -> None:
    """``--out`` can take the converted file: new (or ``force``), a .gguf name, in an existing writable folder."""
    if out.exists() and not force:
        raise ValueError(f"--out {out} exists; choose another name or add --force.")
    if out.suffix.lower() != ".gguf":
        raise ValueError(f"--out {out} must end in .gguf (ComfyUI lists .gguf files only).")
    if not out.parent.exists():
        raise ValueError(f"--out {out}: the folder {out.parent} does not exist; create that folder first, or give "
                         "a path in an existing folder.")
    check_writable(out, "--out")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    try:
        check_out(out, args.force)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    partial = out.with_name(out.name + ".part")
    try:
        counts = write_gguf(args.checkpoint, partial, args.type)
    except (CheckpointError, ValueError, OSError) as exc:
        partial.unlink(missing_ok=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    partial.replace(out)  # a cancelled conversion never leaves a truncated .gguf behind
    print(f"wrote {out}: {sum(counts.values())} tensors ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})")
    return 0
