"""cosmos3_core.model."""
