"""cosmos3_core.testing."""
