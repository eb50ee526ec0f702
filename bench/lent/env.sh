# Sourced on a lent GPU machine at the start of each call, from the repository root, after `export
# T_START=$(date +%s)` (bench/lent/wheels.sh made the .lent/ it reads; carry it). Installs the carried wheels into
# /tmp/site and ComfyUI into /tmp/comfy once per machine (a warm machine keeps /tmp between calls), sets the
# environment, prints the card, the torch and the commit, and defines:
#   capped SECONDS_LEFT_AT_END CMD...   CMD under a timeout that ends it that many seconds before the call's cap
#   cards NAME ARGS...                  one `bench_lowvram.py --card-sizes` process (ARGS: --cases…, --steps…) into
#                                       $OUT/cards_NAME.json and $OUT/log_NAME.txt, then one line per case
# CAP (default 590 s) is the call's own limit, counted from T_START.
export PYTHONPATH=/tmp/site COMFYUI_DIR=/tmp/comfy/ComfyUI PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -f /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .lent/whl/*.whl $(ls .lent/mo/*.whl 2>/dev/null) || return 1
    mkdir -p /tmp/comfy && tar xzf .lent/comfy.tgz -C /tmp/comfy || return 1
    touch /tmp/site/.installed
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
[ -d .lent/mo ] && python3 -c "import modelopt, modelopt.torch.quantization; print('modelopt', modelopt.__version__)" 2>&1 | tail -2

capped() {
    local end=$1; shift
    local left=$(( ${CAP:-590} - end - ($(date +%s) - T_START) ))
    if [ "$left" -lt 30 ]; then echo "== skipped, ${left}s left: $*"; return 0; fi
    timeout "$left" "$@"
}

cards() {
    local name=$1; shift
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync capped 0 python3 bench/bench_lowvram.py \
        --comfyui /tmp/comfy/ComfyUI --card-sizes --out "$OUT/cards_$name.json" "$@" > "$OUT/log_$name.txt" 2>&1
    echo "== $name rc=$? t=$(( $(date +%s) - T_START ))s"
    python3 bench/lent/summary.py < "$OUT/log_$name.txt"
    grep -E 'Traceback|Error' "$OUT/log_$name.txt" | tail -3
}
