"""What a process's first call of each CUDA library route costs at a Cosmos3 run's sizes, and how much of it a tiny
call of each route on another thread beforehand (``cosmos3_core.kernels.cuda_libraries.load_cuda_libraries``, which
a ComfyUI server's preload makes with ``COSMOS3_PRELOAD_CUDA_LIBRARIES=1``) takes off.

Fresh processes: one discarded first (it reads the libraries from a possibly cold page cache), then two arms
alternating: ``cold`` (CUDA initialised, as ComfyUI's start does, then idle) and ``loaded`` (the same, with
``load_cuda_libraries`` on a thread that ends before the idle time, as the preload ends before a prompt comes).
Each then times, on its main thread, the first and the second call of each route at Nano's 1280×720 sizes: a
text-tower and a generation-layer GEMM (no bias, as Nano's linears), the Wan2.2 VAE decoder's channels-last 3-D
convolutions at its first (1,024 channels, 45×80) and last (256 channels, 360×640) stages, and grouped-query
attention (32 query over 8 key/value heads, head_dim 128) through the pack's entry point, causal over a prompt and
not over the image tokens. One JSON line per process as it ends; ``--out`` is rewritten with all so far after
each. ``--tiny``: the same code on the CPU at small sizes (the timings mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from common import COND_TOKENS, NANO, RESOLUTIONS, WAN22_VAE, sync  # bench/common puts the repo on the path


def _conv3d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv3d(x, w, padding=(0, 1, 1))


def _attention(causal: bool):
    from cosmos3_core.kernels.attention import sdpa_attention

    return lambda q, k, v: sdpa_attention(q, k, v, causal=causal)


def full_routes() -> list:
    """(name, input shapes, call) at Nano's geometry and the Wan2.2 VAE's (bench/common), T2I 1280×720 with a
    ``COND_TOKENS`` prompt: each input a bf16 tensor of that shape, channels-last where it is 5-D."""
    d, f, heads, kv_heads, hd = (NANO[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                     "num_key_value_heads", "head_dim"))
    height, width, _ = RESOLUTIONS["t2i"]
    lh, lw = height // WAN22_VAE["scale_factor_spatial"], width // WAN22_VAE["scale_factor_spatial"]
    ph, pw = height // WAN22_VAE["patch_size"], width // WAN22_VAE["patch_size"]
    top, bottom = (WAN22_VAE["decoder_base_dim"] * WAN22_VAE["dim_mult"][i] for i in (-1, 0))
    image, text = lh * lw, COND_TOKENS
    return [
        ("text_gemm", [(text, d), (d, d)], F.linear),
        ("layer_gemm", [(image, d), (f, d)], F.linear),
        ("vae_conv3d_first_stage", [(1, top, 3, lh, lw), (top, top, 3, 3, 3)], _conv3d),
        ("vae_conv3d_last_stage", [(1, bottom, 3, ph, pw), (bottom, bottom, 3, 3, 3)], _conv3d),
        ("text_causal_attention", [(1, heads, text, hd)] + [(1, kv_heads, text, hd)] * 2, _attention(True)),
        ("image_attention", [(1, heads, image, hd)] + [(1, kv_heads, image + text, hd)] * 2, _attention(False)),
    ]


TINY = [
    ("text_gemm", [(16, 32), (32, 32)], F.linear),
    ("vae_conv3d_first_stage", [(1, 8, 3, 10, 10), (8, 8, 3, 3, 3)], _conv3d),
    ("text_causal_attention", [(1, 4, 16, 32), (1, 2, 16, 32), (1, 2, 16, 32)], _attention(True)),
]
CHILD_TIMEOUT_S = 300


def one_process(arm: str, tiny: bool, settle_s: float) -> dict:
    """This process's record: the arm, the ahead load's seconds, and each route's first and second call."""
    from cosmos3_core.kernels.cuda_libraries import load_cuda_libraries

    device = torch.device("cpu" if tiny else "cuda")
    torch.zeros(1, device=device)  # the CUDA context, as a ComfyUI server's start makes it
    record: dict = {"arm": arm}
    if arm == "loaded":
        thread = threading.Thread(target=lambda: record.update(ahead_s=round(load_cuda_libraries(device), 4)))
        thread.start()
        thread.join()
    time.sleep(settle_s)  # the page open before the first prompt
    for name, shapes, call in TINY if tiny else full_routes():
        inputs = [torch.randn(s, device=device, dtype=torch.bfloat16) for s in shapes]
        inputs = [t.contiguous(memory_format=torch.channels_last_3d) if t.dim() == 5 else t for t in inputs]
        sync()
        times = []
        for _ in range(2):
            start = time.perf_counter()
            with torch.no_grad():
                call(*inputs)
            sync()
            times.append(round(time.perf_counter() - start, 4))
        record[name] = {"first_s": times[0], "second_s": times[1]}
        del inputs
    return record


def child(arm: str, args) -> dict:
    """``one_process`` in a fresh Python process: its record, with the process's wall time (or its error)."""
    cmd = [sys.executable, __file__, "--one", arm, "--settle", str(args.settle)] + (["--tiny"] * args.tiny)
    start = time.perf_counter()
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=CHILD_TIMEOUT_S)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if lines else {"arm": arm, "error": run.stderr[-2000:]}
    except subprocess.TimeoutExpired:
        record = {"arm": arm, "error": f"timed out after {CHILD_TIMEOUT_S} s"}
    record["process_wall_s"] = round(time.perf_counter() - start, 2)
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=4, help="fresh processes, arms alternating cold/loaded")
    p.add_argument("--settle", type=float, default=2.0, help="idle seconds before the first route's call")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "probe_first_cuda_calls.json")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--one", choices=["cold", "loaded"], help=argparse.SUPPRESS)  # a child process's arm
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one, args.tiny, args.settle)))
        return
    results = {"device": "cpu (tiny)" if args.tiny else torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version(), "discarded_first": child("cold", args), "processes": []}
    print(json.dumps({"discarded_first": results["discarded_first"]}), flush=True)
    for i in range(args.processes):
        record = child(("cold", "loaded")[i % 2], args)
        print(json.dumps(record), flush=True)
        results["processes"].append(record)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
