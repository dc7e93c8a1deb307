"""The dense tasks' default training lengths per data set: the short protocol on the Fashion-MNIST
scenes (1,000 canvases, 4 detector epochs, 1 fine-tuning epoch), the long one on the shapes set and
a ``--data`` folder; every flag overrides its part."""
from __future__ import annotations

import pytest

from vitbench.core.options import RunOptions
from vitbench.errors import VitbenchError
from vitbench.host import get_host
from vitbench.tasks.dense.data import SCENES, SHAPES
from vitbench.tasks.dense.protocol import DENSE_EPOCHS, dense_finetune_for
from vitbench.tasks.dense.schedule import FULL_SCHEDULE, schedule_for


def test_the_scenes_train_short_and_everything_else_long():
    scenes = schedule_for(SCENES)
    assert (dict(scenes.detector_epochs), dict(scenes.finetune_epochs), scenes.train_limit) == (
        {"det": 4, "seg": 4}, {"det": 1, "seg": 1}, 1000)
    for data in (SHAPES, "/data/coco", None):
        assert schedule_for(data) is FULL_SCHEDULE
    assert dict(FULL_SCHEDULE.detector_epochs) == {"det": 8, "seg": 4} and FULL_SCHEDULE.train_limit is None
    assert FULL_SCHEDULE.finetune_epochs == DENSE_EPOCHS  # the protocol's long default
    assert dense_finetune_for("det", "all", scenes.finetune_epochs["det"]).record()["min_epochs"] == 1


@pytest.mark.parametrize("task", ["det", "seg"])
@pytest.mark.parametrize("data, flags, limit", [
    (None, {}, 1000),  # the default data: the scenes' first 1,000 canvases
    (SCENES, {"train_limit": 3000}, 3000),  # every scene
    (SHAPES, {}, None),  # every image of the shapes set
])
def test_the_plan_carries_the_datas_training_images(task, data, flags, limit):
    setup = get_host().task(task).setup(RunOptions(task=task, methods=("ltm",), data=data, **flags))
    assert setup.plan["train_limit"] == limit


@pytest.mark.parametrize("task", ["det", "seg"])
def test_the_detector_epochs_follow_the_data_unless_given(task):
    dense = get_host().task(task)
    assert dense._epochs(dense.info.options(), SCENES) == 4
    assert dense._epochs(dense.info.options(), SHAPES) == {"det": 8, "seg": 4}[task]
    assert dense._epochs(dense.info.options(detector_epochs=2), SCENES) == 2
    with pytest.raises(VitbenchError, match="--detector-epochs 0 is out of range; it must be >= 1"):
        dense.setup(RunOptions(task=task, methods=("ltm",), task_options={"detector_epochs": 0}))
