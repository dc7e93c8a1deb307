"""Headings and plot titles say what the rows were evaluated on: the data, its classes, the image size."""
from __future__ import annotations

from vitbench.report import render_markdown
from vitbench.report.data_words import data_words


def test_the_data_its_classes_and_image_size_in_words(make_record):
    recs = [{**make_record(m, m, None, top1_pct=90.0, gmacs=g), "data": "fashion-mnist", "num_classes": 10,
             "input_size": [1, 28, 28]} for m, g in (("baseline", 0.35), ("tome", 0.25))]
    assert data_words(recs) == "fashion-mnist, 10 classes, 28x28 images"
    assert "(data: fashion-mnist, 10 classes, 28x28 images)" in render_markdown(recs)
    assert data_words([{"data": "shapes"}, {"input_size": "odd"}]) == "shapes" and data_words([]) == ""
