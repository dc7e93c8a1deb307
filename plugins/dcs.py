"""dcs: being written (issue 3)."""
