"""The bottom layer: what every other layer uses and that knows no method, model or task -- files
and the cache, run options and method parameters, number guards, progress and interrupts
(docs/architecture.md, "The layers")."""
