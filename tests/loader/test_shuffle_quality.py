"""tools/shuffle_quality.py: larger windows mix better, and a window of every shard is the full shuffle."""

from __future__ import annotations

from shuffle_quality import measure


def test_mixing_improves_with_the_window_and_reaches_the_full_shuffle() -> None:
    settings = dict(shard_records=100, classes=20, batch_size=32, epochs=1, seed=0)
    rows = {window: measure(4000, window=window, **settings) for window in (1, 4, 40, None)}
    neighbours = [rows[w]["neighbours in a batch"] for w in (1, 4, 40)]
    assert neighbours[0] > neighbours[1] > neighbours[2]
    assert rows[40] == rows[None]
    assert rows[1]["shards per batch"] <= 2.0 < rows[4]["shards per batch"] <= 4.5  # a batch may straddle two windows
    assert all(0.9 < row["displacement"] < 1.1 for window, row in rows.items() if window != 1)
