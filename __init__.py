"""Cosmos3 for ComfyUI. Inside ComfyUI this exposes the nodes (V3 ``comfy_entrypoint``) and the frontend extension in
``web/`` (the order of the pack's cards in the Templates dialog); elsewhere it is inert, so ``cosmos3_core`` stays
usable as a plain library and CLI without ComfyUI installed."""

WEB_DIRECTORY = "./web"

try:
    import comfy_api.latest  # noqa: F401 — present only inside a ComfyUI host
except ImportError:  # pragma: no cover - outside ComfyUI
    comfy_entrypoint = None
else:
    from .nodes import comfy_entrypoint  # noqa: F401
