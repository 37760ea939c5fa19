"""Tasks' floors: the chance or shortcut level each states, derived from its spec, and what
the validator accepts."""

import dataclasses

import pytest
import torch

from ddl_dynamics._task import make_task
from ddl_dynamics._task_check import TaskCheckError, check_task


@pytest.mark.parametrize(
    ("spec", "floor"),
    [
        ({"hops": 3}, 0.625),  # 1/2 + 1/2 · 1/4
        ({"hops": 3, "reassign": True}, 0.4375),  # 1/4 + 3/4 · 1/4
        ({"hops": 1, "reassign": True}, 0.4375),
        ({"hops": 2, "chains": 3, "values": 5}, 1 / 3 + 2 / 3 / 5),
        ({"hops": 3, "negate": True, "values": 2}, 0.5),  # the answer is a coin to a shortcut
    ],
)
def test_the_var_chain_floor_is_the_score_of_answering_with_a_random_value_binding(spec, floor):
    """The shortcut simulated on the task's own sequences: each query answered with the
    value of a random assignment that binds a value (a chain's start or a stale binding)."""
    task = make_task("var-chain", **spec)
    assert task.floor == pytest.approx(floor)
    data = task.sample(3000, 0, "train")
    start = task.sequence_length - task.chains
    referent = (data.inputs[:, :start] - task.values - task.pool) % task.referents
    binds_value = (referent < task.values).float()
    picks = torch.multinomial(
        binds_value, task.chains, replacement=True, generator=torch.Generator().manual_seed(1)
    )
    guess = referent.gather(1, picks)
    accuracy = (guess == data.targets[:, start:]).float().mean().item()
    assert accuracy == pytest.approx(floor, abs=0.02)  # 3000 · chains queries: SE ≤ 0.007


def test_the_floors_of_the_other_tasks():
    assert make_task("mqar", pairs=4).floor == 0.25
    assert make_task("parity").floor == make_task("seq-parity").floor == 0.5
    assert make_task("nested-spheres").floor == 0.5
    assert make_task("seq-overwrite", values=8).floor == 0.125
    assert make_task("char-lm", vocab=64).floor == 6.0  # log2(64): a uniform guess
    assert make_task("oscillator").floor is None  # no chance level for an MSE flow


def test_check_task_refuses_a_floor_that_is_not_a_value_short_of_the_best():
    parity = make_task("parity")

    @dataclasses.dataclass(frozen=True)
    class Certain(type(parity)):
        @property
        def floor(self) -> float:
            return 1.0

    check_task(parity)
    with pytest.raises(TaskCheckError, match=r"floor must be None or an accuracy in \[0, 1\)"):
        check_task(Certain())
