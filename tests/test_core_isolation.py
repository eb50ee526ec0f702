"""``cosmos3_core`` is a plain library: every module imports with ComfyUI absent and pulls in none of its modules."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMFY_MODULES = ("comfy", "comfy_api", "comfy_extras", "comfy_execution", "folder_paths", "server", "execution",
                 "latent_preview", "node_helpers")


def test_core_modules_import_without_comfyui():
    import cosmos3_core

    names = sorted(m.name.removeprefix("cosmos3_core.") for m in pkgutil.walk_packages(cosmos3_core.__path__, "cosmos3_core."))
    assert {"model.transformer", "pipeline", "sampling.loop", "vae.video", "reasoner.reasoner"} <= set(names)
    code = (
        "import sys, importlib\n"
        f"sys.path = [p for p in sys.path if 'ComfyUI' not in p]; sys.path.insert(0, {str(ROOT)!r})\n"
        f"for name in {names!r}: importlib.import_module('cosmos3_core.' + name)\n"
        f"leaked = sorted(m for m in sys.modules if m.split('.')[0] in {COMFY_MODULES!r})\n"
        "print('LEAKED', leaked)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr
    assert "LEAKED []" in out.stdout, out.stdout
