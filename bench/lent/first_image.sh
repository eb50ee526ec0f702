# Issue 38 on a lent H100/H200 (after `. bench/lent/env.sh`, .lent from `bench/lent/wheels.sh --server`): a server's
# first T2I on an empty compile cache (`--stage ours` empties it each time) queued 10 s after the server is up (a
# user opening the page; the preload done), four servers alternating the pack's early start of Inductor's compile
# workers off (COSMOS3_PRESTART_COMPILE_WORKERS=0: torch starts them at the first compile) and on (the default),
# each with its second run and the server log's preload line. The first server is the machine's first; the others
# find its page cache and the pack's bytecode warm. A fifth server, early start on, is queued 120 s after it is up:
# torch has stopped the idle workers by then (60-90 s after their readiness job) and forks them again from the
# sidecar at the compile. About 400 s with the install and the write stage (the fifth is skipped when time is short).
W=/root/.cache/cosmos3/bench/server_path
S="--work $W --comfyui $COMFYUI_DIR --python python3"
FE="--front-end-root=/tmp/fe"
mkdir -p /tmp/fe && echo '<html></html>' > /tmp/fe/index.html
capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" --stage write | tail -1
n=0
for arm in 0:10 1:10 0:10 1:10 1:120; do
    prestart=${arm%%:*} settle=${arm##*:}
    n=$((n + 1))
    COSMOS3_PRESTART_COMPILE_WORKERS=$prestart capped 0 python3 bench/bench_server_path.py $S --server-args="$FE" \
        --stage ours --settle $settle --shapes t2i --out "$OUT/first_t2i_${n}_prestart${prestart}_settle$settle.json" \
        | grep -E "^\[ours\]|Error"
    grep -hE "background|Prompt executed" "$W/comfyui-ours.log" | sed "s/^/  [$n prestart=$prestart settle=$settle] /"
done
