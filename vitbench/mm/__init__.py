"""vitbench's OpenMMLab layer: registries, the classifier wrapper, runner helpers, compat fixes.

Importing any ``vitbench.mm`` module first applies the compatibility fixes
(:func:`vitbench.mm.compat.apply_compat`), so they are in place before mmpretrain/mmdet
modules are imported through vitbench.
"""
from vitbench.mm.compat import apply_compat

apply_compat()
