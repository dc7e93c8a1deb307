"""The one place where vitbench works around OpenMMLab quirks on the current torch/numpy.

Each fix below says what breaks without it. :func:`apply_compat` applies them all; it is
idempotent and cheap after the first call, and the ``vitbench.mm`` package calls it on import,
so every mm code path in vitbench has it before mmpretrain/mmdet modules load. Other tasks add
their quirks here (one function each, called from :func:`apply_compat`, or -- like
:func:`deterministic_cublas` -- from the place that needs it).
"""
from __future__ import annotations

import importlib
import os
import pickle
import threading
import warnings

_lock = threading.Lock()
_applied = False


def _import_mmcv_transformer_quietly() -> None:
    """mmcv 2.1 (full build, with ``mmcv.ops``) raises an ``ImportWarning`` on every import of
    ``mmcv.cnn.bricks.transformer`` ("``MultiScaleDeformableAttention`` has been moved ...")
    -- it warns *because* the import works. mmpretrain's backbones import that module, so
    ``import mmpretrain.models`` warns, and a test suite that turns warnings into errors fails
    at collection. Import it once here with exactly that warning ignored; later imports are
    cached and silent. No global warning filter is changed. mmcv without its ops (``mmcv-lite``,
    the cls install) warns instead that the import failed ("install mmcv rather than mmcv-lite"):
    ignored too, as the cls task uses no op.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"``MultiScaleDeformableAttention`` has been moved",
                                category=ImportWarning)
        warnings.filterwarnings("ignore", message=r"Fail to import ``MultiScaleDeformableAttention``")
        import mmcv.cnn.bricks.transformer  # noqa: F401


#: HistoryBuffer's statistics methods, which its pickled state names (see below).
_HISTORY_BUFFER_METHODS = ("min", "max", "current", "mean")


def _history_buffer_getattr(obj: object, name: str) -> object:
    """Stand-in for ``builtins.getattr`` inside ``weights_only`` loads: resolves only
    ``HistoryBuffer.<statistics method>``, the one use mmengine checkpoints make of it.
    """
    from mmengine.logging.history_buffer import HistoryBuffer

    if obj is HistoryBuffer and name in _HISTORY_BUFFER_METHODS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(f"checkpoint asks for getattr({obj!r}, {name!r}); only mmengine "
                                 "HistoryBuffer statistics are allowed in weights_only loads")


def _safe_globals_for_mmengine_checkpoints() -> None:
    """torch >= 2.6 loads with ``weights_only=True`` by default; mmengine's ``load_checkpoint``
    and ``Runner(resume=True)`` call ``torch.load`` without the argument, so checkpoints written
    by mmengine's ``CheckpointHook`` fail to load. What they hold beyond tensors: the
    ``message_hub`` state with ``HistoryBuffer`` objects (numpy arrays inside, and -- through
    ``HistoryBuffer.__getstate__`` -- its statistics methods, pickled as
    ``getattr(HistoryBuffer, "min")``), and numpy scalars in ``meta``. Allow exactly those
    (``add_safe_globals``) instead of turning the check off. ``builtins.getattr`` itself would
    open the door to any attribute of any allowed object, so it is mapped to
    :func:`_history_buffer_getattr`, which resolves only those four methods.
    """
    import numpy as np
    import torch
    from mmengine.logging.history_buffer import HistoryBuffer

    allowed: list = [HistoryBuffer, np.ndarray, np.dtype, (_history_buffer_getattr, "builtins.getattr")]
    # numpy 2 moved ``numpy.core`` to ``numpy._core``; pickles name the module they came from.
    for module_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = importlib.import_module(module_name)
        except ImportError:
            continue
        allowed += [(module._reconstruct, f"{module_name}._reconstruct"),
                    (module.scalar, f"{module_name}.scalar")]
    # numpy >= 1.25 pickles dtypes by class (``numpy.dtypes.Float64DType`` ...); allow the
    # numeric ones that mmengine's buffers and meta hold.
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in ("Float64DType", "Float32DType", "Float16DType", "Int64DType", "Int32DType",
                     "Int16DType", "Int8DType", "UInt8DType", "BoolDType"):
            if hasattr(dtypes, name):
                allowed.append(getattr(dtypes, name))
    torch.serialization.add_safe_globals(allowed)


#: the first transformers major whose layout mmpretrain 1.2's multimodal models cannot import
_TRANSFORMERS_BREAKING_MAJOR = 5


def _transformers_major() -> int | None:
    """The installed transformers' major version (``None``: not installed), read from its
    distribution metadata -- importing transformers itself takes seconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def _mmpretrain_without_multimodal() -> None:
    """mmpretrain 1.2 imports its multimodal models (BLIP, BLIP-2, OFA, ...) whenever
    ``transformers>=4.28`` is installed (``mmpretrain.utils.dependency.WITH_MULTIMODAL``). With
    transformers 5 their imports fail -- several names moved out of ``transformers.modeling_utils``
    -- and BLIP's ``try/except`` leaves ``PreTrainedModel = None``, so ``import mmpretrain``
    dies with ``TypeError: NoneType takes no arguments``, taking ``vitbench run --task cls``
    down. vitbench uses none of those models. So, with transformers >= 5 installed and
    mmpretrain not yet imported, load ``mmpretrain.utils.dependency`` on its own (from its file,
    without running ``mmpretrain/__init__``) with ``WITH_MULTIMODAL = False``: mmpretrain then
    registers its multimodal names as the placeholders it uses when transformers is absent
    (which raise a clear ImportError if ever built). Nothing else of mmpretrain changes.
    """
    import importlib.util
    import sys
    from pathlib import Path

    name = "mmpretrain.utils.dependency"
    major = _transformers_major()
    if major is None or major < _TRANSFORMERS_BREAKING_MAJOR or "mmpretrain" in sys.modules:
        return
    package = importlib.util.find_spec("mmpretrain")  # finds the package without importing it
    if package is None or not package.submodule_search_locations:
        return
    path = Path(next(iter(package.submodule_search_locations))) / "utils" / "dependency.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.WITH_MULTIMODAL = False
    sys.modules[name] = module  # `from mmpretrain.utils.dependency import ...` finds this one


def deterministic_cublas() -> None:
    """mmengine's ``randomness=dict(deterministic=True)`` calls
    ``torch.use_deterministic_algorithms(True)`` but does not set ``CUBLAS_WORKSPACE_CONFIG``;
    on a GPU every cuBLAS matmul then raises a RuntimeError. Set torch's documented value,
    unless the user chose one. (Called by vitbench's runner set-up for deterministic runs
    only, since the smaller workspace can cost a little speed.)
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def ssd_head_predict_fix(model: object) -> None:
    """mmdet 3.3.0 ``SSDHead.predict`` reads ``self.loss_cls`` (in ``BaseDenseHead.
    _predict_by_feat_single``), an attribute ``SSDHead`` never sets: every SSD/SSDLite
    evaluation fails with ``'SSDHead' object has no attribute 'loss_cls'`` (upstream issues
    #11063/#11305). Set it to ``None`` on every ``SSDHead`` of ``model`` that lacks it (what
    the upstream fix does); called by the det task when it builds a detector. An instance
    attribute, not a class one: a subclass that does own a ``loss_cls`` module keeps it.
    """
    from mmdet.models.dense_heads import SSDHead

    for module in model.modules():  # type: ignore[attr-defined]
        if isinstance(module, SSDHead) and "loss_cls" not in module.__dict__ and "loss_cls" not in module._modules:
            module.loss_cls = None


def apply_compat() -> None:
    """Apply every OpenMMLab compatibility fix (idempotent; thread-safe)."""
    global _applied
    if _applied:
        return
    with _lock:
        if _applied:
            return
        _mmpretrain_without_multimodal()  # before anything imports mmpretrain
        _import_mmcv_transformer_quietly()
        _safe_globals_for_mmengine_checkpoints()
        _applied = True
