"""More than one GPU on ``torch.distributed``: CFG-parallel × Ulysses sequence parallel × tensor parallel, and a
parallel VAE decode.

* ``mesh.py``     — process group + ``cfg`` × ``ulysses`` × ``tp`` DeviceMesh, the bad-input checks, failure handling;
* ``ulysses.py``  — sequence ↔ head all-to-all around the generation tower's attention;
* ``tensor.py``   — tensor parallel: both towers' decoder layers sharded Megatron-style on DTensor, loaded sharded;
* ``sizing.py``   — what one rank of a layout holds (parameters, a step's working memory), computed;
* ``denoiser.py`` — ``ParallelDenoiser``: the model's ``denoise_step`` contract, run by one rank of the mesh;
* ``vae.py``      — the tiled VAE decode's tiles spread across ranks;
* ``run.py``      — one generation on every rank (what ``torchrun -m cosmos3_core.generate --cfg-parallel
  --ulysses K --tp T`` and bench/bench_parallel.py call);
* ``devices.py``  — the in-process option: the two guidance branches on two local devices (ComfyUI).
"""
