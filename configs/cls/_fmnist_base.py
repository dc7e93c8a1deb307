# What both embedded Fashion-MNIST models' training configs share (mmengine python config):
# imports, the evaluation metric, the optimiser and the seeding. fmnist_deit_default.py and
# fmnist_vit_default.py inherit it (`_base_`) and add their model, data and schedule.
custom_imports = dict(imports=["vitbench.mm.registry"], allow_failed_imports=False)
default_scope = "mmpretrain"

val_evaluator = dict(type="mmpretrain.Accuracy", topk=(1, 5))
val_cfg = dict()

optim_wrapper = dict(
    optimizer=dict(type="AdamW", lr=2e-3, weight_decay=0.05, betas=(0.9, 0.999)),
    clip_grad=dict(max_norm=1.0),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={".pos_embed": dict(decay_mult=0.0),
                                    ".cls_token": dict(decay_mult=0.0)}),
)
randomness = dict(seed=0, deterministic=True)
