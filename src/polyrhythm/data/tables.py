"""Generated tables of the shapes the asynchronous-training thesis's Spark MLlib study
trained on: HIGGS's (28 features, a binary target: logistic regression, the 28-15-15-2
perceptron) and YearPredictionMSD's (90 features, a year: linear regression). As the study
replicated its real sets to make large synthetic ones, these make a table of any number of
rows with the real one's width and kind of target, the same for a seed on every process.

The features are correlated Gaussians of unequal scales (so that standardising them
matters); the target is a fixed linear function of them plus noise, its sign for HIGGS's
shape, a year around 1998 for YearPredictionMSD's.
"""

from __future__ import annotations

import numpy as np

from polyrhythm.data import TABLE_SHAPES
from polyrhythm.data.source import ArraySource, Source

CHUNK_ROWS = 262_144  # rows generated at once: float64 intermediates stay about 200 MB


def load_table(settings, seed: int) -> Source:
    features, binary = TABLE_SHAPES[settings.table_like]
    rows = settings.table_rows
    rng = np.random.default_rng([seed, 0x7AB1E])
    mixing = rng.normal(size=(features, features)) / np.sqrt(features) + np.eye(features)
    scales = rng.uniform(0.1, 10.0, size=features)
    offsets = rng.normal(0.0, 5.0, size=features)
    weights = rng.normal(size=features) / np.sqrt(features)
    x = np.empty((rows, features), np.float32)
    y = np.empty(rows, np.float64)
    for start in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - start)
        z = rng.standard_normal((n, features)) @ mixing
        y[start:start + n] = z @ weights + 0.3 * rng.standard_normal(n)
        x[start:start + n] = z * scales + offsets
    if binary:
        return ArraySource(x, (y > 0).astype(np.int64), 2)
    return ArraySource(x, 1998.0 + 10.0 * y, 1, real_targets=True)
