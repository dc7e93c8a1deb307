"""The package re-exports its public API."""
from __future__ import annotations

import vitbench.measure as measure


def test_every_public_name_resolves() -> None:
    for name in measure.__all__:
        assert getattr(measure, name) is not None
    assert {"count_gmacs", "count_params_m", "measure_throughput", "measure_latency",
            "measure_peak_memory", "speedup", "efficiency", "GmacsResult", "ThroughputResult",
            "LatencyResult"} <= set(measure.__all__)


def test_a_model_on_the_meta_device_is_one_error_naming_a_tensor() -> None:
    import pytest
    import timm
    import torch

    from vitbench.errors import ParamError
    from vitbench.measure import count_gmacs, count_params_m, measure_throughput

    with torch.device("meta"):
        model = timm.create_model("test_vit")
    for measure in (lambda: count_gmacs(model, torch.randn(1, 3, 160, 160)),
                    lambda: measure_throughput(model, batch_size=1, input_size=(3, 160, 160), repeats=1)):
        with pytest.raises(ParamError, match=r"model has no values to run: .* is on the meta device"):
            measure()
    assert count_params_m(model) > 0  # counting parameters needs no values
