"""vitbench's built-in plugins, installed as ``vitbench_plugins``.

Each module (or package) is an ordinary plugin registered through the ``vitbench`` entry-point
group (see pyproject.toml), exactly as a third-party package would register its own. A method's
package registers in its torch-free ``__init__`` and keeps its reducers and ``build`` in
``reduction.py``, named by reference and imported when a run asks for the method
(docs/architecture.md, "Plugins load light").
"""
