"""What the test modules share: the ComfyUI host, the browser driver, one error measure and the checkpoint factory.

- ``comfy_host``: a real ComfyUI 0.3.75 host (throwaway homes, the in-process executor, a ``main.py`` server).
- ``cdp``: a small Chrome DevTools Protocol client for the canvas test (needs ``websocket-client``).
- ``compare.rel``: the relative error the parity tests bound.
- ``fixtures``: ``tiny_checkpoint`` (session-wide tiny random checkpoints, each distinct one built once) and
  ``host`` (the in-process host, pack loaded, tiny checkpoints and test inputs in place); tests/conftest.py
  registers them.

tests/conftest.py puts tests/ on ``sys.path``, so test files (and ``example_workflows/run.sh``) import these as
``from support import comfy_host``. The folder is a package so that its modules never clash with a test module
or with ComfyUI's top-level modules; pytest does not collect from it (no ``test_*.py`` here).
"""
