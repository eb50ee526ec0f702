#!/usr/bin/env bash
# Cosmos3 text-to-video with sound, end to end on a fresh machine, through a real ComfyUI server:
#
#   bash example_workflows/run.sh                                   # embedded tiny random checkpoint (CPU, seconds)
#   bash example_workflows/run.sh --checkpoint /models/Cosmos3-Nano # a real checkpoint, full 1280x720x189 as shipped
#   bash example_workflows/run.sh --checkpoint DIR --width 832 --height 480 --frames 93 --steps 35 --out fox.mp4
#
# 1. Sets up the Python 3.11 venv and ComfyUI 0.3.75 exactly as the tests do (tests/run.sh, setup only).
# 2. Makes a throwaway ComfyUI home with this pack in custom_nodes/ and either builds the tiny checkpoint
#    (cosmos3_core.testing.tiny) into models/cosmos3/ or symlinks --checkpoint DIR there.
# 3. Starts `main.py` on 127.0.0.1, queues example_workflows/api/cosmos3_t2av.json (shrunk to 96x64, 9 frames, 3 steps
#    on the tiny checkpoint; as shipped with a real one unless --width/--height/--frames/--steps are given),
#    waits for /history, prints the absolute path of the mp4 (stdout, last line) and stops the server.
#
# Options: --checkpoint DIR  --width N --height N --frames N --steps N --seed N --prompt TEXT --dtype auto|bf16|fp16|fp32
#          --weight-dtype auto|bf16|fp16|fp8_e4m3fn|fp8_e5m2 (storage of the transformer's weights; fp8 halves them)
#          --out FILE (copy the mp4 there)  --gpu | --cpu (default: GPU when torch sees one)  --timeout SECONDS
#          --keep-home (keep the throwaway home's models/ too; output/ and comfyui.log are always kept)
# Environment: COSMOS3_VENV, COSMOS3_PYTHON as for tests/run.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for arg in "$@"; do
    case "$arg" in -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
done

COSMOS3_SETUP_ONLY=1 bash "$REPO/tests/run.sh" </dev/null
VENV="${COSMOS3_VENV:-$HOME/.cache/cosmos3/venv}"

COMFYUI_DIR="$VENV/ComfyUI" COSMOS3_REPO="$REPO" exec "$VENV/bin/python" - "$@" <<'PYEOF'
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(os.environ["COSMOS3_REPO"])
sys.path.insert(0, str(REPO / "tests"))  # support.comfy_host: throwaway homes and the server wrapper the tests use
sys.path.append(str(REPO))               # cosmos3_core (appended: never shadows ComfyUI's modules)
from support import comfy_host  # noqa: E402


def log(msg: str) -> None:
    print(f"[example_workflows/run.sh] {msg}", file=sys.stderr, flush=True)


ap = argparse.ArgumentParser(prog="example_workflows/run.sh")
ap.add_argument("--checkpoint", type=Path, help="a Cosmos3 checkpoint folder (Hub layout); default: tiny random")
ap.add_argument("--width", type=int)
ap.add_argument("--height", type=int)
ap.add_argument("--frames", type=int)
ap.add_argument("--steps", type=int)
ap.add_argument("--seed", type=int)
ap.add_argument("--prompt")
ap.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"])
ap.add_argument("--weight-dtype", choices=["auto", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2"])
ap.add_argument("--out", type=Path, help="copy the mp4 to this file")
dev = ap.add_mutually_exclusive_group()
dev.add_argument("--gpu", dest="cpu", action="store_false", default=None)
dev.add_argument("--cpu", dest="cpu", action="store_true")
ap.add_argument("--timeout", type=float, help="seconds to wait for the video (default 600 tiny, 14400 real)")
ap.add_argument("--keep-home", action="store_true")
args = ap.parse_args()

t0 = time.monotonic()
tiny = args.checkpoint is None
if not tiny and not (args.checkpoint.expanduser() / "transformer" / "config.json").is_file():
    sys.exit(f"[example_workflows/run.sh] {args.checkpoint} is not a Cosmos3 checkpoint folder "
             "(no transformer/config.json)")
home_parent = Path(tempfile.mkdtemp(prefix="cosmos3-run-"))
base = comfy_host.comfy_home(home_parent)
models = base / "models" / "cosmos3"
models.mkdir(parents=True, exist_ok=True)
if tiny:
    from cosmos3_core.testing.tiny import build_tiny_checkpoint

    name = "cosmos3-tiny-nano"
    ckpt = build_tiny_checkpoint(models / name, variant="nano", sound=True, seed=0)
    log(f"built the tiny random Nano checkpoint in {ckpt} (random weights: the video is noise)")
else:
    src = args.checkpoint.expanduser().resolve()
    name = src.name
    ckpt = models / name
    ckpt.symlink_to(src, target_is_directory=True)
    log(f"linked {src} as models/cosmos3/{name}")

api = json.loads((REPO / "example_workflows" / "api" / "cosmos3_t2av.json").read_text())
loader = next(k for k, v in api.items() if v["class_type"] == "Cosmos3Loader")
text = next(k for k, v in api.items() if v["class_type"] == "Cosmos3TextEncode")
sampler = next(k for k, v in api.items() if v["class_type"] == "Cosmos3KSamplerUniPCDualTower")
create = next(k for k, v in api.items() if v["class_type"] == "CreateVideo")
save = next(k for k, v in api.items() if v["class_type"] == "SaveVideo")
api[loader]["inputs"]["checkpoint"] = name
api[loader]["inputs"]["dtype"] = args.dtype or ("fp32" if tiny else api[loader]["inputs"]["dtype"])
if args.weight_dtype:
    api[loader]["inputs"]["weight_dtype"] = args.weight_dtype
shape = {"width": 96, "height": 64, "num_frames": 9} if tiny else {}
for key, value in (("width", args.width), ("height", args.height), ("num_frames", args.frames)):
    if value is not None:
        shape[key] = value
api[text]["inputs"].update(shape)
if args.prompt:
    api[text]["inputs"]["prompt"] = args.prompt
if args.steps or tiny:
    api[sampler]["inputs"]["steps"] = args.steps or 3
if args.seed is not None:
    api[sampler]["inputs"]["seed"] = args.seed
if not (ckpt / "sound_tokenizer").is_dir():  # Edge: no sound head -> video only
    log(f"{name} has no sound_tokenizer/: generating video without sound")
    api[sampler]["inputs"]["sound"] = False
    api[create]["inputs"].pop("audio", None)
    for k in [k for k, v in api.items() if v["class_type"] == "Cosmos3AudioDecode"]:
        del api[k]
api[create]["inputs"]["fps"] = api[text]["inputs"]["fps"]

cpu = args.cpu
if cpu is None:
    import torch

    cpu = not torch.cuda.is_available()
timeout = args.timeout or (600.0 if tiny else 14400.0)
t = api[text]["inputs"]
log(f"{name}: {t['width']}x{t['height']}, {t['num_frames']} frames @ {t['fps']} fps, "
    f"{api[sampler]['inputs']['steps']} steps, sound={api[sampler]['inputs']['sound']}, "
    f"{'CPU' if cpu else 'GPU'}; ComfyUI home {base}")

rc = 1
try:
    with comfy_host.ComfyServer(base, cpu=cpu, start_timeout=300) as srv:
        log(f"ComfyUI {srv.system_stats()['system']['comfyui_version']} up on {srv.url} "
            f"in {srv.startup_s:.1f} s (log {srv.log_path})")
        pid = srv.queue(api)
        started, last_note = time.monotonic(), time.monotonic()
        while True:
            entry = (srv.get(f"/history/{pid}") or {}).get(pid)
            status = (entry or {}).get("status") or {}
            if status.get("completed") or status.get("status_str") in ("success", "error"):
                break
            if srv.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI died while running the workflow:\n{srv.log_tail()}")
            now = time.monotonic()
            if now - started > timeout:
                srv.post("/interrupt", {})
                raise TimeoutError(f"no video after {timeout:.0f} s (raise --timeout); log {srv.log_path}")
            if now - last_note > 30:
                tail = (srv.log_tail(1).split("\r")[-1] or "").strip()
                log(f"running for {now - started:.0f} s ... {tail[:120]}")
                last_note = now
            time.sleep(0.5)
        if status.get("status_str") != "success":
            msgs = status.get("messages") or []
            err = next((d for e, d in msgs if e == "execution_error"), None)
            what = (f"{err.get('node_type')} (node {err.get('node_id')}): {err.get('exception_message', '').strip()}"
                    if err else json.dumps(msgs)[:2000])
            raise RuntimeError(f"the workflow failed: {what}\nlog {srv.log_path}")
        items = entry["outputs"][save]["images"]
        mp4 = (base / "output" / items[0].get("subfolder", "") / items[0]["filename"]).resolve()
        log(f"done in {time.monotonic() - started:.1f} s (total {time.monotonic() - t0:.1f} s)")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(mp4, args.out)
        mp4 = args.out.resolve()
    print(mp4, flush=True)
    rc = 0
except Exception as exc:  # noqa: BLE001 - one clear line for the user, details in the log
    log(f"ERROR: {exc}")
finally:
    if not args.keep_home:
        if ckpt.is_symlink():
            ckpt.unlink()  # never delete a user's checkpoint, only our link to it
        shutil.rmtree(base / "models", ignore_errors=True)
sys.exit(rc)
PYEOF
