"""Figures of which patches a method merged or pruned, block by block (docs/visualize.md).

:mod:`~vitbench.visualize.groups` turns a reduced model's token state into per-patch group maps
(torch); :mod:`~vitbench.visualize.draw` paints them over the image (matplotlib);
:mod:`~vitbench.visualize.figure` checks the inputs and puts the two together.
"""
from vitbench.visualize.figure import Choice, check_choices, figure_name, visualize
from vitbench.visualize.groups import DROPPED, BlockGroups, group_map, trace_groups
from vitbench.visualize.inputs import parse_blocks

__all__ = ["DROPPED", "BlockGroups", "Choice", "check_choices", "figure_name", "group_map", "parse_blocks",
           "trace_groups", "visualize"]
