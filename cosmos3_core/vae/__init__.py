"""cosmos3_core.vae.video."""
