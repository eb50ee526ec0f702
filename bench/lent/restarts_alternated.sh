# Sourced by bench/lent/restart_staging.sh and load_and_restart.sh (W, S, FE set; `ours --shapes t2i` run): four
# restarted servers' first T2I after a 10 s settle, the towers' first move through pinned staging and, alternately,
# through ComfyUI's pageable Module.to (--disable-pinned-memory), each into its own --out, the server log's load
# lines printed and the log copied to $OUT.
n=0
for way in staged pageable staged pageable; do
    n=$((n + 1))
    extra=""; [ "$way" = pageable ] && extra=" --disable-pinned-memory"
    capped 0 python3 bench/bench_server_path.py $S --server-args="$FE$extra" --stage restart --settle 10 \
        --shapes t2i --out "$W/restart_${n}_$way.json" --copy-to "$OUT/restart_${n}_$way" | grep -E "restart|Error"
    grep -hE "pinned staging|loaded completely|Prompt executed" "$W/comfyui-restart.log" | sed "s/^/  [$n $way] /"
    cp "$W/comfyui-restart.log" "$OUT/comfyui-restart-${n}-$way.log" 2>/dev/null
done
