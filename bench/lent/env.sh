# Sourced on a lent GPU machine at the start of each call, from the repository root (bench/lent/wheels.sh made the
# .lent/ it reads; carry it). Installs the carried wheels into /tmp/site and ComfyUI into /tmp/comfy once per
# machine and per contents of .lent (a warm machine keeps /tmp between calls; the install prints the torch and
# ModelOpt's import, or its error), sets the environment, prints the card, and defines:
#   capped SECONDS_LEFT_AT_END CMD...   CMD under a timeout that ends it that many seconds before the call's cap;
#                                       skipped (status 125, a line on stderr) when under 30 s would be left for it
#   cards NAME ARGS...                  one `bench_lowvram.py --card-sizes` process (ARGS: --cases…, --steps…) into
#                                       $OUT/cards_NAME.json and $OUT/log_NAME.txt, one line per case; its status
# CAP (default 590 s) is the call's own limit, counted from T_START (default: when this file is sourced).
# Bytecode is cached as a pip install caches it: the lent image sets PYTHONDONTWRITEBYTECODE=1 and its torch has no
# __pycache__, so every process would compile the source of each module it imports (diffusers' VAE classes: ~16 s a
# process there). The install compiles the carried wheels' and the image's site-packages into PYTHONPYCACHEPREFIX
# once per machine, as pip does at install; ComfyUI and the pack are left to their first import, as a clone is.
: "${T_START:=$(date +%s)}"
export T_START PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" COMFYUI_DIR=/tmp/comfy/ComfyUI PYTHONUNBUFFERED=1
export PYTHONPYCACHEPREFIX=/tmp/pyc; unset PYTHONDONTWRITEBYTECODE
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
_stamp="/tmp/site/.installed-$(ls -l .lent/whl .lent/mo .lent/srv .lent/comfy.tgz 2>/dev/null | md5sum | cut -c1-12)"
if [ ! -f "$_stamp" ]; then
    rm -rf /tmp/site /tmp/comfy
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .lent/whl/*.whl $(ls .lent/mo/*.whl .lent/srv/*.whl 2>/dev/null) || return 1
    mkdir -p /tmp/comfy && tar xzf .lent/comfy.tgz -C /tmp/comfy || return 1
    _t=$(date +%s)
    python3 -m compileall -q -j 0 -x '/tests?/' /tmp/site \
        "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null 2>&1
    echo "bytecode compiled into $PYTHONPYCACHEPREFIX in $(( $(date +%s) - _t )) s ($(find /tmp/pyc -name '*.pyc' | wc -l) files)"
    touch "$_stamp"
    python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
    [ -d .lent/mo ] && python3 -c "import modelopt, modelopt.torch.quantization; print('modelopt', modelopt.__version__)" 2>&1 | tail -2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

capped() {
    local end=$1; shift
    local left=$(( ${CAP:-590} - end - ($(date +%s) - T_START) ))
    if [ "$left" -lt 30 ]; then echo "== skipped, ${left}s left: $*" >&2; return 125; fi
    timeout -k 10 "$left" "$@"
}

cards() {
    local name=$1; shift
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync capped 0 python3 bench/bench_lowvram.py \
        --comfyui "$COMFYUI_DIR" --card-sizes --out "$OUT/cards_$name.json" "$@" > "$OUT/log_$name.txt" 2>&1
    local rc=$?
    echo "== $name rc=$rc$([ $rc = 125 ] && echo ' (skipped: too little time left)') t=$(( $(date +%s) - T_START ))s"
    python3 bench/lent/summary.py < "$OUT/log_$name.txt"
    grep -E 'Traceback|Error' "$OUT/log_$name.txt" | tail -3
    return "$rc"
}
