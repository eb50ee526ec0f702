"""cosmos3_core.reasoner.reasoner."""
