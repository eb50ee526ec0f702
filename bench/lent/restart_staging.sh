# Issue 38 on a lent H100/H200 (after `. bench/lent/env.sh`, .lent from `bench/lent/wheels.sh --server`): how fast a
# checkpoint's tensors reach the GPU by way of copy (bench/probe_host_copy.py), then a restarted server's first T2I
# with the towers' first move through pinned staging (nodes/model_handle.Cosmos3Patcher) and, alternately, through
# ComfyUI's pageable Module.to (--disable-pinned-memory turns the staging off), each after a 10 s settle.
W=/root/.cache/cosmos3/bench/server_path
S="--work $W --comfyui $COMFYUI_DIR --python python3"
FE="--front-end-root=/tmp/fe"
capped 0 python3 bench/probe_host_copy.py --gib 6 --pieces 300 --out "$OUT/probe_host_copy.json"
rm -rf /tmp/probe_host_copy
. bench/lent/server_check.sh
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage write --copy-to "$OUT" | tail -3
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage ours --shapes t2i --out "$W/ours.json" --copy-to "$OUT/ours"
. bench/lent/restarts_alternated.sh
