"""Package discovery only; all metadata is in pyproject.toml.

``plugins/`` is installed as the package ``vitbench_plugins`` (docs/architecture.md, "Top level").
"""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["vitbench", "vitbench.*"]) + ["vitbench_plugins"]
    + [f"vitbench_plugins.{name}" for name in find_packages("plugins")],  # a method plugin per package
    package_dir={"vitbench_plugins": "plugins"},
    package_data={"vitbench.tasks.cls": ["weights/*.pth", "weights/*.json"],
                  "vitbench_plugins.ltm": ["weights/*.pth", "weights/*.json"],
                  "vitbench_plugins.ltmp": ["weights/*.pth", "weights/*.json"]},
)
