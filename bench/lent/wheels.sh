#!/usr/bin/env bash
# Run here, from the repository root, before a session's calls to a lent GPU machine (which reaches no package
# index): puts what the benchmarks and GPU tests need there into .lent/ (ignored by git), for `carry`.
#   .lent/whl/    diffusers 0.42.1 (the reference), gguf 0.19.0, einops, torchsde, trampoline, pytest and its two
#                 dependencies: what the machine's image (torch, transformers, Triton, numpy, safetensors…) lacks
#   .lent/mo/     with --modelopt: nvidia-modelopt 0.43.0 and the modules its import needs there
#   .lent/srv/    with --server: what ComfyUI's main.py needs there to serve (aiohttp, SQLAlchemy and alembic, av,
#                 pydantic; not the 18 MB frontend package: start it with --front-end-root, bench/README)
#   .lent/comfy.tgz  the test venv's ComfyUI (tests/run.sh installs it; COSMOS3_SETUP_ONLY=1 stops after that)
# Each run starts the folders afresh. On the machine: `. bench/lent/env.sh` (see there). ≈ 14 MB, with ModelOpt
# ≈ 35 MB, with the server's ≈ 61 MB (not both: a call carries 64 MiB with the working tree).
set -euo pipefail
case "$#:${1:-}" in 0:|1:--modelopt|1:--server) ;; *) echo "usage: $0 [--modelopt | --server]" >&2; exit 2 ;; esac
comfy="${COMFYUI_DIR:-$HOME/.cache/cosmos3/venv/ComfyUI}"
get() {  # get DIR SPEC...: CPython 3.12 x86-64 wheels, no dependencies (each one named); a failed download stops
    local dir=$1; shift
    rm -rf "$dir" && mkdir -p "$dir"
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir" "$@" 2>&1 | { grep -v "is ignored" || true; }
}
[ -d "$comfy" ] || { echo "no ComfyUI at $comfy: run COSMOS3_SETUP_ONLY=1 bash tests/run.sh first" >&2; exit 1; }
get .lent/whl diffusers==0.42.1 gguf==0.19.0 einops==0.8.2 torchsde==0.2.6 trampoline==0.1.2 pytest==9.2.0 \
    pluggy==1.7.0 iniconfig==2.3.1
rm -rf .lent/mo .lent/srv
if [ "${1:-}" = "--server" ]; then
    # ComfyUI 0.3.75's requirements that the image lacks, at the test venv's versions (the image has torch,
    # torchvision, torchaudio, transformers, tokenizers, sentencepiece, safetensors, numpy, scipy, Pillow, PyYAML,
    # psutil, tqdm); kornia and spandrel are optional there (their nodes do not load)
    get .lent/srv aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 multidict==7.2.1 \
        propcache==0.5.4 yarl==1.25.1 idna==3.21 attrs==26.1.0 alembic==1.20.1 SQLAlchemy==2.1.9 Mako==1.4.3 \
        MarkupSafe==3.0.4 av==18.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4
fi
if [ "${1:-}" = "--modelopt" ]; then
    # nvidia-modelopt's own requirements the image lacks, and theirs, at the test venv's versions (PuLP 4 imports
    # orloge, which the machine lacks; PuLP 3 does not)
    get .lent/mo nvidia-modelopt==0.43.0 nvidia-ml-py==13.615.71 pulp==3.3.2 omegaconf==2.4.0 ninja==1.13.2 \
        pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
        typing-extensions==4.16.0 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0
fi
tar czf .lent/comfy.tgz -C "$(dirname "$comfy")" --exclude=.git --exclude=__pycache__ "$(basename "$comfy")"
du -sh .lent
echo 'carry: [".lent"]; on the machine, first: . bench/lent/env.sh'
