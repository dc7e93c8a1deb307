"""A benchmark run: the plan expands the options into run specs (:mod:`vitbench.run.plan`), the
executor runs them one at a time and stores each record (:mod:`vitbench.run.execute`);
docs/architecture.md, "How a run flows"."""
