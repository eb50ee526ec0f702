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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))



def _conv3d(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.conv3d(x, w, padding=(0, 1, 1))


def _attention(causal: bool):
    from cosmos3_core.kernels.attention import sdpa_attention

    return lambda q, k, v: sdpa_attention(q, k, v, causal=causal)


# (name, input shapes, channels-last 3-D, call): each input a bf16 tensor of that shape.
FULL = [
    ("text_gemm", [(1536, 4096), (4096, 4096)], False, F.linear),
    ("layer_gemm", [(3600, 4096), (12288, 4096)], False, F.linear),
    ("vae_conv3d_first_stage", [(1, 1024, 3, 45, 80), (1024, 1024, 3, 3, 3)], True, _conv3d),
    ("vae_conv3d_last_stage", [(1, 256, 3, 360, 640), (256, 256, 3, 3, 3)], True, _conv3d),
    ("text_causal_attention", [(1, 32, 1536, 128), (1, 8, 1536, 128), (1, 8, 1536, 128)], False, _attention(True)),
    ("image_attention", [(1, 32, 3600, 128), (1, 8, 5136, 128), (1, 8, 5136, 128)], False, _attention(False)),
]
TINY = [
    ("text_gemm", [(16, 32), (32, 32)], False, F.linear),
    ("vae_conv3d_first_stage", [(1, 8, 3, 10, 10), (8, 8, 3, 3, 3)], True, _conv3d),
    ("text_causal_attention", [(1, 4, 16, 32), (1, 2, 16, 32), (1, 2, 16, 32)], False, _attention(True)),
]
CHILD_TIMEOUT_S = 300


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    for name, shapes, channels_last, call in TINY if tiny else FULL:
        fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
        inputs = [torch.randn(s, device=device, dtype=torch.bfloat16).contiguous(memory_format=fmt)
                  if len(s) == 5 else torch.randn(s, device=device, dtype=torch.bfloat16) for s in shapes]
        sync(device)
        times = []
        for _ in range(2):
            start = time.perf_counter()
            with torch.no_grad():
                call(*inputs)
            sync(device)
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
