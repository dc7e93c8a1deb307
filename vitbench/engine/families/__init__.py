"""Model-family adapters: a uniform view of each backbone family's attention blocks."""
