"""cosmos3_core.cli."""
