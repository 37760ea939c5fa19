"""The dry run's time estimate: groups spread over workers longest first. (How close a
group's estimate comes to its training is measured, not tested: timing is for benchmarks.)"""

import pytest

from ddl_dynamics.bench.estimate import wall_seconds


@pytest.mark.parametrize(
    ("seconds", "jobs", "wall"),
    [([5, 4, 3], 1, 12), ([5, 4, 3], 2, 7), ([5, 4, 3], 3, 5), ([9, 1, 1, 1], 2, 9), ([], 2, 0)],
)
def test_groups_go_longest_first_to_the_worker_that_frees_first(seconds, jobs, wall):
    assert wall_seconds(seconds, jobs) == wall
