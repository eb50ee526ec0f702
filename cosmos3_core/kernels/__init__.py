"""cosmos3_core.kernels."""
