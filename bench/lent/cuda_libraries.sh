# Issue 38 on a lent H100/H200 (after `. bench/lent/env.sh`, .lent from `bench/lent/wheels.sh --server`): a restarted
# server's first T2I with the preload's load of the CUDA libraries off (COSMOS3_PRELOAD_CUDA_LIBRARIES=0, the
# default) and on (=1), in the order off, on, on, off, each after a 10 s settle, the server log's preload, load and
# prompt lines printed; between the server's first runs and the restarts, what a process's first call of each CUDA
# library route costs with and without those tiny calls ahead (bench/probe_first_cuda_calls.py: one discarded, then
# six fresh processes). About 350 s with the install and the write stage.
W=/root/.cache/cosmos3/bench/server_path
S="--work $W --comfyui $COMFYUI_DIR --python python3"
FE="--front-end-root=/tmp/fe"
mkdir -p /tmp/fe && echo '<html></html>' > /tmp/fe/index.html
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage write | tail -1
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage ours --shapes t2i --out "$OUT/ours_t2i.json" \
    | grep -E "^\[ours\]|Error"
capped 0 python3 bench/probe_first_cuda_calls.py --processes 6 --out "$OUT/probe_first_cuda_calls.json"
n=0
for libraries in 0 1 1 0; do
    n=$((n + 1))
    COSMOS3_PRELOAD_CUDA_LIBRARIES=$libraries capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" \
        --stage restart --settle 10 --shapes t2i --out "$OUT/restart_${n}_libraries$libraries.json" \
        | grep -E "restart|Error"
    grep -hE "background|pinned staging|loaded completely|Prompt executed" "$W/comfyui-restart.log" \
        | sed "s/^/  [$n libraries=$libraries] /"
done
