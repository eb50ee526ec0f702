# Issue 38 on a lent H100/H200 (after `. bench/lent/env.sh`, .lent from `bench/lent/wheels.sh --server`): a fresh
# machine's first T2I through the real server on an empty compile cache, twice — queued 10 s after the server is up
# (a user opening the page; the preload's imports done) and queued at once (`--stage ours` empties its compile cache
# each time; the second server finds the machine's page cache warm) — each with its second run, and the server log's
# preload and compile-worker lines. About 150 s with the write stage.
W=/root/.cache/cosmos3/bench/server_path
S="--work $W --comfyui $COMFYUI_DIR --python python3"
FE="--front-end-root=/tmp/fe"
mkdir -p /tmp/fe && echo '<html></html>' > /tmp/fe/index.html
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage write | tail -1
for how in settled at_once; do
    (
        settle=10; [ "$how" = at_once ] && settle=0
        capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage ours --settle $settle --shapes t2i \
            --out "$OUT/first_t2i_$how.json" | grep -E "^\[ours\]|Error"
        grep -hE "background|compile workers|Prompt executed" "$W/comfyui-ours.log" | sed "s/^/  [$how] /"
    )
done
