"""Render BENCHMARKS.md tables from ``bench_generation.py``'s results JSON (no GPU needed)."""

from __future__ import annotations


def render(r: dict) -> str:
    lines = [
        f"Measured {r['date']} on {r['gpu']}: torch {r['torch']}, diffusers {r['diffusers']}, transformers "
        f"{r['transformers']}, Python {r['python']}. Full-size Cosmos3-Nano, random bf16 weights shared by both "
        f"sides; cond prompt {r['cond_tokens']} tokens, uncond {r['uncond_tokens']}; guidance 6 (two branches).",
        "",
        "### One guided denoising step",
        "",
        "| shape | gen tokens | ours (s) | diffusers (s) | speed-up | ours TFLOP/s | diffusers TFLOP/s | "
        "ours peak GiB | diffusers peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in r["steps"].items():
        lines.append(
            f"| {name} {s['width']}×{s['height']}/{s['frames']}f | {s['gen_tokens']:,} | {s['ours_step_s']:.3f} | "
            f"{s['diffusers_step_s']:.3f} | **{s['speedup']:.2f}×** | {s['ours_tflops']} | {s['diffusers_tflops']} | "
            f"{s['ours_peak_gib']} | {s['diffusers_peak_gib']} |"
        )
    if r.get("e2e_ours") or r.get("e2e_diffusers"):
        lines += ["", "### End to end (text prefill, 35 guided steps with sound, VAE decode, audio decode)", "",
                  "| shape | ours total (s) | prefill | denoise | VAE decode | audio decode | ours peak GiB "
                  "(generation / prefill) | diffusers total (s) | diffusers peak GiB |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name in sorted(set(r.get("e2e_ours", {})) | set(r.get("e2e_diffusers", {}))):
            o, d = r.get("e2e_ours", {}).get(name), r.get("e2e_diffusers", {}).get(name)
            ours = (f"{o['total_without_offload_s']} | {o['prefill_s']} | {o['denoise_35_steps_s']} | "
                    f"{o['vae_decode_s']} | {o['audio_decode_s']} | {o['peak_generation_gib']} / "
                    f"{o['peak_prefill_gib']}") if o else "– | – | – | – | – | –"
            ref = f"{d['total_s']} | {d['peak_gib']}" if d else "– | –"
            lines.append(f"| {name} | {ours} | {ref} |")
    return "\n".join(lines)
