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
n=0
for way in staged pageable staged pageable; do
    n=$((n + 1))
    extra=""; [ "$way" = pageable ] && extra=" --disable-pinned-memory"
    capped 0 python3 bench/bench_server_path.py $S --server-args="$FE$extra" --stage restart --settle 10 \
        --shapes t2i --out "$W/restart_${n}_$way.json" --copy-to "$OUT/restart_${n}_$way" | grep -E "restart|Error"
    grep -hE "pinned staging|loaded completely|Prompt executed" "$W/comfyui-restart.log" | sed "s/^/  [$n $way] /"
    cp "$W/comfyui-restart.log" "$OUT/comfyui-restart-${n}-$way.log" 2>/dev/null
done
