"""Treasury tables (issue 13 §2): reconciliation runs and their breaks."""
