# Sourced or run on a lent GPU machine after `. bench/lent/env.sh` with .lent from `bench/lent/wheels.sh --server`:
# checks in about 20 s that ComfyUI's main.py serves there with the pack linked, on an empty page instead of the
# frontend package (--front-end-root), before a server-path call spends minutes writing a checkpoint. Prints the
# imports' result, when /object_info/Cosmos3Loader answered, and the server log's import lines and errors.
# SERVER_CHECK_ARGS: more main.py arguments (--cpu: a dry run on a machine without a GPU).
python3 -c "import aiohttp, sqlalchemy, alembic, av, pydantic, pydantic_settings; print('imports ok, av', av.__version__)" 2>&1 | tail -1
mkdir -p /tmp/fe && echo '<html></html>' > /tmp/fe/index.html
ln -sfn "$PWD" "$COMFYUI_DIR/custom_nodes/cosmos3_pack"
(cd "$COMFYUI_DIR" && timeout 90 python3 main.py --listen 127.0.0.1 --port 8199 --front-end-root /tmp/fe ${SERVER_CHECK_ARGS:-} > /tmp/server_check.log 2>&1 &)
for i in $(seq 1 80); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8199/object_info/Cosmos3Loader', timeout=2)" 2>/dev/null; then
        echo "server up with the pack after about $i s"; break
    fi
    sleep 1
done
grep -E "Import times|cosmos3_pack|IMPORT FAILED|Error|error" /tmp/server_check.log | head -8
pkill -f "main.py --listen 127.0.0.1 --port 8199"
rm -f "$COMFYUI_DIR/custom_nodes/cosmos3_pack"
