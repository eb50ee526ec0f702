"""cosmos3_core.modes."""
