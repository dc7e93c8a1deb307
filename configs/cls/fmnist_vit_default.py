# Trains vitbench's embedded default model "vitbench-fmnist-vit" (mmengine python config).
#
# vitbench itself builds this config in Python (vitbench.tasks.cls.default_model.train_config)
# so an installed wheel needs no config files; this file is the same config for the mmengine
# tools, and tests/tasks/test_cls_default_model.py keeps the two equal. Train with it by hand:
#   python -c "from mmengine.config import Config; from mmengine.runner import Runner; \
#     Runner.from_cfg(Config.fromfile('configs/cls/fmnist_vit_default.py')).train()"
# (with work_dir set). The usual way: python -m vitbench.tasks.cls.default_model
#
# Not inherited from mmpretrain's _base_ configs: their runtime adds checkpoint and
# visualisation hooks vitbench does not want, and the data/model/schedule parts are all
# specific to this tiny model.
_base_ = ["./_fmnist_base.py"]  # imports, metric, optimiser, seeding

# timm VisionTransformer: 32x32 grey input, 4x4 patches (64 tokens), 12 blocks.
model = dict(
    type="mmpretrain.ImageClassifier",
    backbone=dict(
        type="vitbench.TimmLogits",
        model=dict(type="vitbench.TimmVisionTransformer", img_size=32, patch_size=4, in_chans=1,
                   num_classes=10, embed_dim=64, depth=12, num_heads=4, mlp_ratio=2.0,
                   global_pool="token", class_token=True),
    ),
    head=dict(type="mmpretrain.ClsHead",
              loss=dict(type="mmpretrain.CrossEntropyLoss", loss_weight=1.0), topk=(1, 5)),
    # mean/std of the padded training images, 0-255 scale (0.2190 and 0.3318 in 0-1)
    data_preprocessor=dict(type="mmpretrain.ClsDataPreprocessor", mean=[55.845], std=[84.609],
                           to_rgb=False),
)

train_dataloader = dict(
    batch_size=64, num_workers=0, persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=True),
    dataset=dict(type="vitbench.OfflineFashionMNIST", split="train", data_dir=None, indices=None,
                 pipeline=[dict(type="mmpretrain.PackInputs")]),
)
# The Fashion-MNIST test split doubles as the validation set (it has no other).
val_dataloader = dict(
    batch_size=256, num_workers=0, persistent_workers=False,
    sampler=dict(type="DefaultSampler", shuffle=False),
    dataset=dict(type="vitbench.OfflineFashionMNIST", split="test", data_dir=None, indices=None),
)

train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)

# 938 iterations (60000 / 64, one epoch); 5% linear warm-up, then cosine.
param_scheduler = [
    dict(type="LinearLR", start_factor=0.01, by_epoch=False, begin=0, end=46),
    dict(type="CosineAnnealingLR", by_epoch=False, begin=46, end=938, T_max=892, eta_min=2e-5),
]
