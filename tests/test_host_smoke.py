"""Smoke tests of the ComfyUI test host itself (tests/support/comfy_host.py), core nodes only.

Nothing here depends on the Cosmos3 nodes: a pack that fails to import is tolerated here
(require_pack=False) and is the business of the node tests (comfy_host.assert_pack_loaded()).
"""
import pytest
from PIL import Image

from support import comfy_host

pytestmark = pytest.mark.comfy


def core_graph(prefix: str) -> dict:
    return {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 0x3366CC}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": prefix}},
    }


def check_png(base, ui_output: dict) -> None:
    images = ui_output["images"]
    assert len(images) == 1 and images[0]["type"] == "output", ui_output
    path = base / "output" / images[0].get("subfolder", "") / images[0]["filename"]
    assert path.is_file(), path
    with Image.open(path) as im:
        assert im.size == (64, 48)
        assert im.getpixel((10, 10))[:3] == (0x33, 0x66, 0xCC)


def test_host_smoke_server(tmp_path):
    base = comfy_host.comfy_home(tmp_path)
    assert (base / "custom_nodes" / comfy_host.PACK_NAME).resolve() == comfy_host.REPO_ROOT
    with comfy_host.ComfyServer(base, require_pack=False) as srv:
        stats = srv.system_stats()
        assert stats["system"]["comfyui_version"] == "0.3.75"
        assert stats["devices"][0]["type"] == "cpu"
        assert srv.object_info("EmptyImage")["output"] == ["IMAGE"]
        assert srv.object_info("NoSuchNode_xyz") is None
        with pytest.raises(comfy_host.PromptValidationError):
            srv.queue({"1": {"class_type": "SaveImage", "inputs": {"filename_prefix": "x"}}})
        entry = srv.run(core_graph("smoke_http"), timeout=120)
        assert entry["status"]["status_str"] == "success"
        check_png(base, entry["outputs"]["2"])
        proc = srv.proc
    assert proc.poll() is not None, "server still running after the context manager exited"


def test_host_smoke_in_process():
    host = comfy_host.get_executor()
    assert "EmptyImage" in host.node_class_mappings
    success, outputs, messages = host.run(core_graph("smoke_inproc"))
    assert success, messages
    assert any(m[0] == "execution_success" for m in messages), messages
    check_png(host.base_dir, outputs["2"])
    with pytest.raises(comfy_host.PromptValidationError):
        host.run({"1": {"class_type": "SaveImage", "inputs": {"filename_prefix": "x"}}})
    # the singleton: same object, and a different explicit base_dir is refused
    assert comfy_host.get_executor() is host
    assert comfy_host.get_executor(host.base_dir) is host
