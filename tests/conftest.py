"""Generic pytest setup only; fixtures belong in the test files that use them.

tests/run.sh runs ``python -m pytest --rootdir=tests tests`` from the repo root, so the repo
root (which is the ComfyUI pack itself; its ``__init__.py`` needs a ComfyUI host) is never
collected as a package. Keep tests/ WITHOUT ``__init__.py`` and give test files unique basenames.
"""
import os
import sys

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)

if _TESTS_DIR not in sys.path:  # ``import comfy_host`` in any import mode
    sys.path.insert(0, _TESTS_DIR)
if _REPO_ROOT not in sys.path:  # ``import cosmos3_core`` also under a plain ``pytest`` call;
    sys.path.append(_REPO_ROOT)  # appended last so it never shadows ComfyUI's nodes/utils/server

# Compile artifacts (inductor caches, ``cosmos3_core.kernels.precompiled``'s AOT files) go to a folder of this test session,
# never into the user's ``~/.cache/cosmos3``, unless the caller chose one.
if not os.environ.get("COSMOS3_CACHE_DIR"):
    import tempfile

    os.environ["COSMOS3_CACHE_DIR"] = tempfile.mkdtemp(prefix="cosmos3-test-cache-")
