"""vitbench's built-in plugins, installed as ``vitbench_plugins``.

Each module is an ordinary plugin registered through the ``vitbench`` entry-point group
(see pyproject.toml), exactly as a third-party package would register its own.
"""
