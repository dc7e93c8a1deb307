"""ltmp: being written (issue 3)."""
