"""The one place where vitbench works around OpenMMLab quirks on the current torch/numpy.

Each fix below says what breaks without it. :func:`apply_compat` applies them all; it is
idempotent and cheap after the first call, and :mod:`vitbench.mm.registry` calls it on import
so any mm code path in vitbench has it. Other tasks add their quirks here (one function each,
called from :func:`apply_compat`).
"""
from __future__ import annotations

import threading
import warnings

_lock = threading.Lock()
_applied = False


def _quiet_pkg_resources_warning() -> None:
    """mmengine imports ``pkg_resources`` (``mmengine.utils.package_utils``), which setuptools
    >= 80 deprecates with a ``UserWarning`` on every import. setuptools < 81 is pinned because
    mmengine and mmcv need the module; the warning tells a vitbench user nothing they can act
    on, so hide exactly that message.
    """
    warnings.filterwarnings("ignore", message=r"pkg_resources is deprecated as an API",
                            category=UserWarning)


def _safe_globals_for_mmengine_checkpoints() -> None:
    """torch >= 2.6 loads with ``weights_only=True`` by default; mmengine's ``load_checkpoint``
    and ``Runner(resume=True)`` call ``torch.load`` without the argument, so checkpoints written
    by mmengine's ``CheckpointHook`` fail to load: their ``message_hub`` holds
    ``HistoryBuffer`` objects with numpy arrays, and ``meta`` numpy scalars. Allow exactly
    those classes (``add_safe_globals``) instead of turning the safety check off.
    """
    import numpy as np
    import torch
    from mmengine.logging.history_buffer import HistoryBuffer

    allowed: list = [HistoryBuffer, np.ndarray, np.dtype]
    # numpy 2 moved ``numpy.core`` to ``numpy._core``; pickles name the module they came from.
    for module_name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                module = __import__(module_name, fromlist=["_reconstruct", "scalar"])
        except ImportError:
            continue
        allowed += [module._reconstruct, module.scalar]
    # The dtype classes of numpy >= 1.25 (``numpy.dtypes.Float64DType`` ...) are pickled by
    # class; allow the numeric ones mmengine's buffers and meta use.
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        for name in ("Float64DType", "Float32DType", "Float16DType", "Int64DType", "Int32DType",
                     "Int16DType", "Int8DType", "UInt8DType", "BoolDType"):
            if hasattr(dtypes, name):
                allowed.append(getattr(dtypes, name))
    torch.serialization.add_safe_globals(allowed)


def apply_compat() -> None:
    """Apply every OpenMMLab compatibility fix (idempotent; thread-safe)."""
    global _applied
    if _applied:
        return
    with _lock:
        if _applied:
            return
        _quiet_pkg_resources_warning()
        _safe_globals_for_mmengine_checkpoints()
        _applied = True
