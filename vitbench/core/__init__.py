"""The bottom layer: what every other layer uses -- files and the cache, run options and method
parameters, number guards, progress and interrupts, and the data a family and a method hand the
engine (:mod:`vitbench.core.contract`); docs/architecture.md, "The layers"."""
