# Evaluates a classification model on the Fashion-MNIST test split (mmengine python config).
#
# vitbench's evaluate_cls builds the same runner in Python, because its model is a runtime
# object (a timm model after a reduction method was applied) and the preprocessing follows that
# model; this file is the equivalent for the mmengine tools and for reading. By default it
# evaluates the embedded default model (trained and cached on first use):
#   python -c "from mmengine.config import Config; from mmengine.runner import Runner; \
#     cfg = Config.fromfile('configs/cls/eval_fmnist.py'); cfg.work_dir = '/tmp/vitbench-eval'; \
#     print(Runner.from_cfg(cfg).test())"
# Another model: set model.backbone.model.name (a timm name) and checkpoint (a local .pth).
custom_imports = dict(imports=["vitbench.mm.registry"], allow_failed_imports=False)
default_scope = "mmpretrain"

model = dict(
    type="mmpretrain.ImageClassifier",
    backbone=dict(type="vitbench.TimmLogits",
                  model=dict(type="vitbench.ClsModel", name="vitbench-fmnist-deit", checkpoint=None)),
    head=dict(type="mmpretrain.ClsHead",
              loss=dict(type="mmpretrain.CrossEntropyLoss", loss_weight=1.0), topk=(1, 5)),
    data_preprocessor=dict(type="mmpretrain.ClsDataPreprocessor", mean=[72.93], std=[90.015],
                           to_rgb=False),
)
test_dataloader = dict(
    batch_size=128, num_workers=0, persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(type="vitbench.OfflineFashionMNIST", split="test", pad_to=28, channels=1,
                 pipeline=[dict(type="mmpretrain.PackInputs")]),
)
test_evaluator = dict(type="mmpretrain.Accuracy", topk=(1, 5))
test_cfg = dict(type="TestLoop")
default_hooks = dict(checkpoint=None)
log_level = "WARNING"
randomness = dict(seed=0)
