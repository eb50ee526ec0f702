"""cosmos3_core.sampling.loop."""
