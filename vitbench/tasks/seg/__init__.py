"""``seg``: instance segmentation with Mask R-CNN on the reduced backbone."""
