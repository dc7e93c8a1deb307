"""ltm: being written (issue 3)."""
