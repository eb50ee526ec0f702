"""Pytest setup for every test module: import paths, a private compile cache, the shared fixtures.

tests/run.sh runs ``python -m pytest --rootdir=tests tests`` from the repo root, so the repo root (which is the
ComfyUI pack itself; its ``__init__.py`` needs a ComfyUI host) is never collected as a package. Keep tests/ WITHOUT
``__init__.py`` and give test files unique basenames. Code that several modules use lives in the ``support``
package (tests/support/: the ComfyUI host, the browser driver, ``rel``, the fixtures below); a fixture only one
module uses stays in that module.

Shared fixtures (tests/support/fixtures.py): ``tiny_checkpoint`` (session; each distinct tiny checkpoint built once
and handed to every module that asks for the same arguments; ``copy=True`` for a test that changes its folder) and
``host`` (module; the in-process ComfyUI host, ready for node tests).
"""
import os
import sys

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(_TESTS_DIR)

if _TESTS_DIR not in sys.path:  # ``from support import comfy_host``, ``from test_workflows import ...``
    sys.path.insert(0, _TESTS_DIR)
if _REPO_ROOT not in sys.path:  # ``import cosmos3_core`` also under a plain ``pytest`` call;
    sys.path.append(_REPO_ROOT)  # appended last so it never shadows ComfyUI's nodes/utils/server

# Compile artifacts (inductor caches, ``cosmos3_core.kernels.precompiled``'s AOT files) go to a folder of this test
# session, never into the user's ``~/.cache/cosmos3``, unless the caller chose one.
if not os.environ.get("COSMOS3_CACHE_DIR"):
    import tempfile

    os.environ["COSMOS3_CACHE_DIR"] = tempfile.mkdtemp(prefix="cosmos3-test-cache-")

from support.fixtures import host, tiny_checkpoint  # noqa: E402, F401  (registered as fixtures of every module)
