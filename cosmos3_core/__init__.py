"""cosmos3_core: NVIDIA Cosmos3 inference in pure PyTorch (no ComfyUI imports).

The ComfyUI nodes in ``nodes/`` and the command-line tools are thin layers over this package.
"""
