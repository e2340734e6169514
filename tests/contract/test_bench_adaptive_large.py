"""The adaptive search's heavier cases on the fake server's simulated clock: a capacity of 376 streams
(waves of hundreds of real streaming requests) and the remaining noise seeds.  Exact and deterministic
like tests/unit/test_bench_adaptive.py, whose tests these are; here for their seconds of CPU each,
which the unit tier's 60 s cannot hold."""
from __future__ import annotations

import pytest
from support.adaptive_checks import (bed, noisy_points_still_end_near_the_truth,  # noqa: F401 (bed: a fixture)
                                     search_lands_on_the_true_capacity_and_knee)


def test_search_lands_on_the_true_capacity_and_knee_at_hundreds_of_streams(bed):
    search_lands_on_the_true_capacity_and_knee(bed(0.010, 0.0001), 0.010, 0.0001, 21.0)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_noisy_points_still_end_near_the_truth(bed, seed):
    noisy_points_still_end_near_the_truth(bed(0.004, 0.0003), seed)
