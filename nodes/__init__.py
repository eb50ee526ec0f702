"""ComfyUI nodes of the Cosmos3 pack (V3 schema): thin glue over ``cosmos3_core``; no tensor math here."""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .action import Cosmos3ActionCondition, Cosmos3LoadActions, Cosmos3SaveActions
from .condition import Cosmos3FirstLastFrame, Cosmos3VAEEncodeCond
from .decode import Cosmos3AudioDecode, Cosmos3VAEDecode
from .errors import with_out_of_memory_message
from .loader import Cosmos3Loader, register_model_folder
from .long_video import Cosmos3LongVideo
from .lora import Cosmos3LoraLoader
from .multigpu import Cosmos3GuidanceOnTwoGPUs
from .reasoner import Cosmos3Reasoner
from .sampler import Cosmos3KSamplerUniPCDualTower
from .text import Cosmos3TextEncode
from .warmup import preload_when_the_server_starts, waits_for_preload

NODES: list[type[io.ComfyNode]] = [
    Cosmos3Loader,
    Cosmos3TextEncode,
    Cosmos3VAEEncodeCond,
    Cosmos3FirstLastFrame,
    Cosmos3KSamplerUniPCDualTower,
    Cosmos3VAEDecode,
    Cosmos3AudioDecode,
    Cosmos3Reasoner,
    Cosmos3LongVideo,
    Cosmos3LoraLoader,
    Cosmos3GuidanceOnTwoGPUs,
    Cosmos3ActionCondition,
    Cosmos3SaveActions,
    Cosmos3LoadActions,
]
for _node in NODES:
    with_out_of_memory_message(_node)  # torch's multi-line out-of-memory report: one line naming the node and the fix
    waits_for_preload(_node)  # a node starts once the server's imports of what a first run needs are done


class Cosmos3Extension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return NODES


async def comfy_entrypoint() -> Cosmos3Extension:
    register_model_folder()
    preload_when_the_server_starts()
    return Cosmos3Extension()
