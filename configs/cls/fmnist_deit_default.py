# Trains vitbench's embedded default model "vitbench-fmnist-deit" (mmengine python config).
#
# vitbench builds this config in Python (vitbench.tasks.cls.default_model.train_config) so an
# installed wheel needs no config files; this file is the same config for the mmengine tools,
# and tests/tasks/test_cls_default_model.py keeps the two equal. Train with it by hand:
#   python -c "from mmengine.config import Config; from mmengine.runner import Runner; \
#     Runner.from_cfg(Config.fromfile('configs/cls/fmnist_deit_default.py')).train()"
# (with work_dir set). The usual way: vitbench default-model --retrain (checkpoints every epoch
# and resumes after an interruption).
#
# The recipe and why: docs/architecture.md, "Embedded defaults".
_base_ = ["./_fmnist_base.py"]  # imports, metric, optimiser, seeding

# timm VisionTransformer of DeiT's layout: 28x28 grey input, 2x2 patches (196 tokens and a class
# token), width 96, 12 blocks, 3 heads. Training continues the shipped weights
# vitbench-fmnist-deit-045611e9ba74 (17 epochs: 9 from timm's initialisation, the first six at 75 %
# patch dropout, then 3, 2 and 3 on every token, the last three with label smoothing) for two more
# epochs on every token at a lower rate, with label smoothing.
model = dict(
    type="mmpretrain.ImageClassifier",
    backbone=dict(
        type="vitbench.TimmLogits",
        model=dict(type="vitbench.TimmVisionTransformer", img_size=28, patch_size=2, in_chans=1,
                   num_classes=10, embed_dim=96, depth=12, num_heads=3, mlp_ratio=4.0,
                   global_pool="token", class_token=True),
    ),
    head=dict(type="mmpretrain.ClsHead",
              loss=dict(type="mmpretrain.LabelSmoothLoss", label_smooth_val=0.1, loss_weight=1.0),
              topk=(1, 5)),
    # mean/std of the training images, 0-255 scale (0.2860 and 0.3530 in 0-1)
    data_preprocessor=dict(type="mmpretrain.ClsDataPreprocessor", mean=[72.93], std=[90.015],
                           to_rgb=False),
)

train_dataloader = dict(
    batch_size=64, num_workers=0, persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=True),
    dataset=dict(type="vitbench.OfflineFashionMNIST", split="train", data_dir=None, indices=None,
                 pad_to=28,
                 pipeline=[dict(type="mmpretrain.PackInputs")]),
)
# The Fashion-MNIST test split doubles as the validation set (it has no other).
val_dataloader = dict(
    batch_size=256, num_workers=0, persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(type="vitbench.OfflineFashionMNIST", split="test", data_dir=None, indices=None,
                 pad_to=28),
)

optim_wrapper = dict(optimizer=dict(lr=1.5e-4))

# The test split is scored after every epoch.
train_cfg = dict(by_epoch=True, max_epochs=2, val_interval=1)

# 1876 iterations (938 an epoch of 60000 / 64, two epochs); 5% linear warm-up, then cosine to 1%
# of the peak (written as the product, the float the Python config computes).
param_scheduler = [
    dict(type="LinearLR", start_factor=0.01, by_epoch=False, begin=0, end=93),
    dict(type="CosineAnnealingLR", by_epoch=False, begin=93, end=1876, T_max=1783, eta_min=1.5e-4 * 0.01),
]
# The weights training starts from, checked against their recorded sha256.
custom_hooks = [dict(type="vitbench.StartFromWeights",
                     file="tasks/cls/weights/vitbench-fmnist-deit-045611e9ba74.pth",
                     sha256="c321732d86e91f57b921b2be24690c95fbd0cacbb100e6e24d493ada9d94e148")]
