"""The expert-load heatmap lays each expert's downsampled series on one grid."""

import pytest

from frontend.expert_load import grid


def test_few_steps_become_columns_of_their_own_with_gaps_where_a_row_has_none():
    x, z = grid([[[2, 0.5], [4, 0.25]], [[2, 0.5], [6, 0.75]]], columns=10)

    assert x == [2, 4, 6]
    assert z == [[0.5, 0.25, None], [0.5, None, 0.75]]


def test_many_steps_are_averaged_over_equal_spans():
    rows = [[[s, float(s % 2)] for s in range(0, 100)], [[0, 1.0], [99, 3.0]]]

    x, z = grid(rows, columns=4)

    assert len(x) == 4 and x[0] == pytest.approx(99 / 8)
    assert z[0] == pytest.approx([0.48, 0.52, 0.48, 0.52], abs=0.03)
    assert z[1] == [1.0, None, None, 3.0]
    assert grid([[], []], columns=4) == ([], [[], []])
