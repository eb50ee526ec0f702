# Issue 38 on a lent H100/H200 (after `. bench/lent/env.sh`, .lent from `bench/lent/wheels.sh --server`): what a
# process's first call of each CUDA library route costs and how much the preload's tiny calls on another thread take
# off (bench/probe_first_cuda_calls.py, six fresh processes), then a restarted server's first T2I with the preload's
# load of the CUDA libraries off (COSMOS3_PRELOAD_CUDA_LIBRARIES=0, the default) and on (=1), alternated, each after a
# 10 s settle, the server log's preload and prompt lines printed. About 300 s with the install and the write stage.
W=/root/.cache/cosmos3/bench/server_path
S="--work $W --comfyui $COMFYUI_DIR --python python3"
FE="--front-end-root=/tmp/fe"
mkdir -p /tmp/fe && echo '<html></html>' > /tmp/fe/index.html
capped 0 python3 bench/probe_first_cuda_calls.py --processes 6 --out "$OUT/probe_first_cuda_calls.json"
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage write | tail -1
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage ours --shapes t2i --out "$OUT/ours_t2i.json" \
    | grep -E "^\[ours\]|Error"
n=0
for libraries in 0 1 0 1; do
    n=$((n + 1))
    COSMOS3_PRELOAD_CUDA_LIBRARIES=$libraries capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" \
        --stage restart --settle 10 --shapes t2i --out "$OUT/restart_${n}_libraries$libraries.json" \
        | grep -E "restart|Error"
    grep -hE "background|Prompt executed" "$W/comfyui-restart.log" | sed "s/^/  [$n libraries=$libraries] /"
done
