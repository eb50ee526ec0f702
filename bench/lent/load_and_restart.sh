# Issue 38 on a lent H100/H200 (after `. bench/lent/env.sh`, .lent from `bench/lent/wheels.sh --server`): the CLI's
# load straight to the GPU with the transformer through pinned staging, by Tensor.to, and diffusers' (`--stage load`,
# fresh processes), then a restarted server's first T2I with the shipped staging (the towers only) and, alternately,
# ComfyUI's pageable Module.to (--disable-pinned-memory), each after a 10 s settle.
W=/root/.cache/cosmos3/bench/server_path
S="--work $W --comfyui $COMFYUI_DIR --python python3"
FE="--front-end-root=/tmp/fe"
. bench/lent/server_check.sh
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage write --copy-to "$OUT" | tail -3
capped 0 python3 bench/bench_server_path.py $S --stage load --out "$OUT/load.json" | grep -E "^\[load\]|Error"
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage ours --shapes t2i --out "$W/ours.json" --copy-to "$OUT/ours"
. bench/lent/restarts_alternated.sh
