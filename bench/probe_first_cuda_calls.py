"""What a process's first call of each CUDA library route costs, and how much of it a tiny call of the same route
on another thread beforehand (``cosmos3_core.kernels.cuda_libraries.load_cuda_libraries``, which a ComfyUI server's
preload makes) takes off.

Fresh processes, alternating two arms: ``cold`` (CUDA initialised, as ComfyUI's start does, then idle) and
``loaded`` (the same, then ``load_cuda_libraries`` on a thread that ends). Each then times, on its main thread, the
first and the second call of each route at a Cosmos3 run's sizes (Nano, 1280×720): a bias GEMM of the text tower and
of the generation layer, a VAE decoder 3-D convolution at the latent's size and a 2-D one at the upsampled size,
and attention over the text and over the image tokens. One JSON line per process as it ends, merged into ``--out``.
``--tiny``: the same code on the CPU at small sizes (the timings mean nothing there).
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

# (name, input shapes, call): each input is a bf16 tensor of that shape.
FULL = [
    ("text_linear", [(1536, 4096), (4096, 4096), (4096,)], lambda x, w, b: F.linear(x, w, b)),
    ("layer_linear", [(3600, 4096), (12288, 4096), (12288,)], lambda x, w, b: F.linear(x, w, b)),
    ("vae_conv3d", [(1, 384, 3, 92, 162), (384, 384, 3, 3, 3)], lambda x, w: F.conv3d(x, w)),
    ("vae_conv2d", [(1, 96, 722, 1282), (96, 96, 3, 3)], lambda x, w: F.conv2d(x, w)),
    ("text_attention", [(1, 32, 1536, 128)] * 3, F.scaled_dot_product_attention),
    ("image_attention", [(1, 32, 3600, 128)] * 3, F.scaled_dot_product_attention),
]
TINY = [
    ("text_linear", [(16, 32), (32, 32), (32,)], lambda x, w, b: F.linear(x, w, b)),
    ("vae_conv3d", [(1, 8, 3, 10, 10), (8, 8, 3, 3, 3)], lambda x, w: F.conv3d(x, w)),
    ("image_attention", [(1, 2, 16, 32)] * 3, F.scaled_dot_product_attention),
]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_process(arm: str, tiny: bool, settle_s: float) -> dict:
    """This process's record: the arm, the ahead load's seconds, and each route's first and second call."""
    from cosmos3_core.kernels.cuda_libraries import ROUTES, load_cuda_libraries

    device = torch.device("cpu" if tiny else "cuda")
    torch.zeros(1, device=device)  # the CUDA context, as a ComfyUI server's start makes it
    time.sleep(settle_s)
    record: dict = {"arm": arm}
    if arm == "loaded":
        def ahead() -> None:
            if tiny:
                x = torch.randn(64, 64, dtype=torch.bfloat16)
                start = time.perf_counter()
                for call in ROUTES.values():
                    call(x)
                record["ahead_s"] = round(time.perf_counter() - start, 4)
            else:
                record["ahead_s"] = round(load_cuda_libraries(device), 4)

        thread = threading.Thread(target=ahead)
        thread.start()
        thread.join()
    for name, shapes, call in TINY if tiny else FULL:
        inputs = [torch.randn(s, device=device, dtype=torch.bfloat16) for s in shapes]
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--processes", type=int, default=4, help="fresh processes, arms alternating cold/loaded")
    p.add_argument("--settle", type=float, default=2.0, help="idle seconds after CUDA's start")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "probe_first_cuda_calls.json")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--one", choices=["cold", "loaded"], help=argparse.SUPPRESS)  # a child process's arm
    args = p.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one, args.tiny, args.settle)))
        return
    results = {"device": "cpu (tiny)" if args.tiny else torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cudnn": torch.backends.cudnn.version(), "processes": []}
    for i in range(args.processes):
        arm = ("cold", "loaded")[i % 2]
        cmd = [sys.executable, __file__, "--one", arm, "--settle", str(args.settle)] + (["--tiny"] * args.tiny)
        start = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if lines else {"arm": arm, "error": run.stderr[-2000:]}
        record["process_wall_s"] = round(time.perf_counter() - start, 2)
        print(json.dumps(record), flush=True)
        results["processes"].append(record)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
