"""State tracking: follow items through a word of swaps, ``(0 1) (1 2) (0 1)``, to where they end.

``items`` items start at their own positions (item i at position i); a word of ``swaps``
transpositions ``(i j)`` each exchanges the items at positions i and j, and a query asks where
item q is after the whole word. On the one-hot state "item q is at position p", ``e_p``, a
transposition is the reflection ``I − 2kkᵀ`` with ``k = (e_i − e_j)/√2``: the delta update at
β = 2 with v = 0 (or at β = 1 with ``v = −kᵀx``, a target read from the state). For ``items``
≥ 3 the symmetric group is not abelian, so the order of the swaps matters, where parity's bit
flips and var-chain's negations commute: each swap acts on the position the swaps before it
produced. Word problems over S_5 are the standard hard case of state tracking (Merrill,
Petty & Sabharwal, ICML 2024); recurrences whose transitions are products of reflections
track them (Grazzi et al., ICLR 2025; Siems et al., DeltaProduct, NeurIPS 2025).

``commute`` is the control in which order does not matter: each sequence draws a random
matching of ``items // 2`` disjoint pairs and every swap is one of them (uniformly, with
repeats: the word may be longer than the matching), so the answer is whether the word holds
the queried item's pair an odd number of times. It needs ``items`` ≥ 4: at 3 the matching is
one pair and the answer is the parity of ``swaps``.

Shortcut levels (``shortcut_levels``), the accuracies of guesses that track nothing: chance,
1/items; the item's own start position, right where the word returns the item there; and
(from two swaps) the last swap alone, right where the swaps before it return the item to its
start. Over all words an item is home after L swaps with probability 1/n + (1 − 1/n)
((n − 3)/(n − 1))^L (0.6, 0.4, 0.3 at n = 5 and L = 1, 2, 3); a short word's test split
holds a fixed few words, whose levels differ, so they are measured on
`FLOOR_SAMPLE` test examples. ``floor`` is the best of them.

Train, val and test hold swap words out from each other (`held_out`): no
val or test word occurs in train, so a model must compose swaps rather than recall words. A
one-swap word is a single token that train must see, so there the whole example (the swap
and its queries) is the unit held out. A word space too small to give every split a share (3
items, 2 swaps: 9 words) fails with `held_out`'s message.

``swap-track`` is the sequence task, for the Transformers: the word, one token per swap, then
every item queried once in random order, scored at the queries only. Tokens: the queries
``0 … items−1`` (token q asks for item q), then the swaps, one per pair ``i < j``. Layout
(``items = 3``, ``swaps = 3``)::

    position  0      1      2      | 3    4    5
    inputs    (0 1)  (1 2)  (0 1)  | 2?   0?   1?
    targets   ·      ·      ·      | 0    2    1

``swap-track-depth`` is its vector twin, for the depth stacks: the l-th swap is the l-th depth
step's control (one-hot over the pairs), so one rewrite is forced per step; the input is the
queried item (one-hot), the target its final position (one-hot, scored by argmax).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ddl_dynamics import (
    IGNORE_INDEX,
    REGIMES,
    Expectation,
    SequenceTask,
    Subject,
    Task,
    TaskData,
    held_out,
    register_task,
    split_generator,
)

#: The linear-in-state Delta recurrence (as parity's): generators from the control, tied.
LINEAR = {"tied": True, "context": "control"}
#: Test examples (seed 0) the shortcut levels are measured on.
FLOOR_SAMPLE = 4096


def swap(x: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """Positions ``x`` ``(n, ·)`` after the transposition of ``i`` and ``j`` ``(n,)``."""
    i, j = i[:, None], j[:, None]
    return torch.where(x == i, j, torch.where(x == j, i, x))


@dataclass(frozen=True)
class SwapWords:
    """The items and the word distribution both swap-track tasks draw from."""

    #: How many items are permuted (3 to 5 is the studied range).
    items: int = 5
    #: Swaps drawn from one random matching of disjoint pairs, so that they commute.
    commute: bool = False

    def check_words(self, swaps: int) -> None:
        """A word of at least one swap, and items enough for the order (or, under commute,
        for two disjoint pairs) to matter."""
        if swaps < 1:
            raise ValueError(f"a word needs at least 1 swap, got {swaps}")
        if self.items < (4 if self.commute else 3):
            raise ValueError(
                f"items must be at least 3, and 4 with commute (3 items have one "
                f"disjoint pair); got {self.items}"
            )

    @property
    def transpositions(self) -> int:
        """How many pairs ``i < j`` there are: the swap tokens."""
        return self.items * (self.items - 1) // 2

    @property
    def pairs(self) -> Tensor:
        """Every transposition ``(i, j)``, ``i < j``, in token order: ``(P, 2)``."""
        return torch.combinations(torch.arange(self.items))

    def words(self, m: int, swaps: int, g: torch.Generator) -> Tensor:
        """``m`` words of ``swaps`` transpositions, as indices into `pairs`."""
        n = self.items
        if not self.commute:
            return torch.randint(0, self.transpositions, (m, swaps), generator=g)
        order = torch.rand(m, n, generator=g).argsort(1)[:, : n // 2 * 2]
        matching = order.view(m, n // 2, 2).sort(-1).values  # (m, n // 2, 2), i < j
        chosen = matching.gather(
            1, torch.randint(0, n // 2, (m, swaps, 1), generator=g).expand(m, swaps, 2)
        )
        index = torch.full((n, n), -1)
        index[tuple(self.pairs.T)] = torch.arange(self.transpositions)
        return index[chosen[..., 0], chosen[..., 1]]

    def asked(self, m: int, queries: int, g: torch.Generator) -> Tensor:
        """``m`` rows of ``queries`` distinct items in random order."""
        return torch.rand(m, self.items, generator=g).argsort(1)[:, :queries]

    def held_out_words(
        self, n: int, swaps: int, queries: int, split: str, g: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """``n`` words of ``split`` and the items each asks for, ``(n, queries)``: the words
        held out by split, or, one swap long, each word together with its queries."""
        if swaps > 1:
            return held_out(lambda m: self.words(m, swaps, g), n, split), self.asked(n, queries, g)
        rows = held_out(
            lambda m: torch.cat([self.words(m, 1, g), self.asked(m, queries, g)], 1), n, split
        )
        return rows[:, :1], rows[:, 1:]

    def positions(self, words: Tensor) -> Tensor:
        """Where every item is before and after each swap: ``(n, swaps + 1, items)``."""
        where = torch.arange(self.items).expand(len(words), -1)
        steps = [where]
        for pair in self.pairs[words].unbind(1):
            where = swap(where, *pair.unbind(-1))
            steps.append(where)
        return torch.stack(steps, dim=1)

    def shortcuts(self, words: Tensor, asked: Tensor, answers: Tensor) -> dict[str, float]:
        """The accuracy of each guess that tracks nothing on these words ``(n, L)``, asked
        items and answers ``(n, queries)``: chance, the item's start and (L ≥ 2) the last
        swap alone."""

        def accuracy(guess: Tensor) -> float:
            return (guess == answers).float().mean().item()

        levels = {"chance": 1 / self.items, "start": accuracy(asked)}
        if words.shape[1] > 1:
            levels["last swap"] = accuracy(swap(asked, *self.pairs[words[:, -1]].unbind(-1)))
        return levels


@register_task("swap-track")
@dataclass(frozen=True)
class SwapTrack(SequenceTask, SwapWords):
    """Swap tracking: a word of transpositions, then where every item ended up.

    Spec: ``swaps`` (the word's length: the knob), ``items``, ``commute``; ``length`` follows
    (None, or ``swaps + items``). Accuracy on the queries only.
    """

    #: The sequence length; it follows from swaps and items (None, or that number).
    length: int | None = None
    #: Transpositions before the queries (the knob).
    swaps: int = 4

    regime: ClassVar = (
        "hypothesis: each swap reflects the query token's position state "
        "(β ≈ 2), one sublayer per swap"
    )
    regimes: ClassVar = ("reflection",)
    knob: ClassVar = "swaps"
    expectations: ClassVar = (
        Expectation(
            Subject("ddl-transformer"),
            "better",
            Subject("ddl-write-transformer"),
            "the erase term matters: a swap moves an item off its position, so the old "
            "position must go from the query token's state; a write-only update leaves it "
            "beside the new one",
        ),
        Expectation(
            Subject("ddl-transformer"),
            "better",
            Subject("ddl-transformer", {"beta_max": 1.0, "beta_init": 0.5}),
            "a transposition of a one-hot position is the reflection I − 2kkᵀ with "
            "k = (e_i − e_j)/√2, one delta update at β = 2; capped at β ≤ 1 a sublayer "
            "reflects only by reading kᵀX into its target (Grazzi et al., ICLR 2025, on "
            "negative eigenvalues for state tracking)",
        ),
    )

    def __post_init__(self) -> None:
        self.check_words(self.swaps)
        if self.length not in (None, self.sequence_length):
            raise ValueError(
                f"length follows from the word: swaps + items = "
                f"{self.sequence_length}; got {self.length}"
            )

    @property
    def sequence_length(self) -> int:
        """The word, then a query per item."""
        return self.swaps + self.items

    @cached_property
    def shortcut_levels(self) -> dict[str, float]:
        """The shortcuts' accuracies on the test split (`SwapWords.shortcuts`)."""
        data, L = self.sample(FLOOR_SAMPLE, 0, "test"), self.swaps
        return self.shortcuts(
            data.inputs[:, :L] - self.items, data.inputs[:, L:], data.targets[:, L:]
        )

    @property
    def floor(self) -> float:
        """The best guess that tracks nothing."""
        return max(self.shortcut_levels.values())

    def split_steps(self, split: str) -> int:
        self.check_split(split)
        return self.sequence_length

    @property
    def in_dim(self) -> int:
        return self.items + self.transpositions

    @property
    def out_dim(self) -> int:
        return self.items

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        """``n`` sequences whose swap words belong to ``split``, with their answers."""
        steps, g = self.split_steps(split), split_generator(seed, split)
        inputs = self.sequences(*self.held_out_words(n, self.swaps, self.items, split, g))
        return TaskData(inputs=inputs, targets=self.answers(inputs), steps=steps)

    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        """``n`` sequences: a word, then every item asked once in random order."""
        return self.sequences(self.words(n, self.swaps, g), self.asked(n, self.items, g))

    def sequences(self, words: Tensor, asked: Tensor) -> Tensor:
        """The tokens of ``words`` (pair indices), then of the items ``asked``."""
        return torch.cat([words + self.items, asked], dim=1)

    def answers(self, inputs: Tensor) -> Tensor:
        """At every query, the final position of its item; IGNORE_INDEX on the word."""
        where = self.positions(inputs[:, : self.swaps] - self.items)[:, -1]
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, self.swaps :] = where.gather(1, inputs[:, self.swaps :])
        return targets


@register_task("swap-track-depth")
@dataclass(frozen=True)
class SwapTrackDepth(Task, SwapWords):
    """Swap tracking over depth: the l-th swap is step l's control; where does item q end?

    ``depth`` is the word's length (one swap per step); ``long`` runs 4× as many swaps.
    Metric: accuracy of the argmax of the final state's read-out (mse on one-hot targets).
    """

    depth: int = 4

    regime: ClassVar = (
        "hypothesis: a linear recurrence (ddl, context=control, tied) needs a "
        "reflection (β = 2) per swap to track the item"
    )
    regimes: ClassVar = ("reflection",)
    metric_name: ClassVar = "accuracy"
    ood_splits: ClassVar = ("long",)
    expectations: ClassVar = (
        Expectation(
            Subject("ddl", {**LINEAR, "beta_max": 2.0}),
            "better",
            Subject("ddl", {**LINEAR, "beta_max": 1.0}),
            "a recurrence linear in its state, h ← A(u)h + b(u), applies a transposition to a "
            "one-hot position only if A(u) can be the reflection I − 2kkᵀ (eigenvalue −1 "
            "along k = (e_i − e_j)/√2): the delta transition I − βkkᵀ at β = 2; with β ≤ 1 "
            "its eigenvalues lie in [0, 1] (Grazzi et al., ICLR 2025). With generators read "
            "from the control alone and tied weights the stack is that recurrence",
        ),
    )

    def __post_init__(self) -> None:
        self.check_words(self.depth)

    @cached_property
    def shortcut_levels(self) -> dict[str, float]:
        """The shortcuts' accuracies on the test split (`SwapWords.shortcuts`)."""
        data = self.sample(FLOOR_SAMPLE, 0, "test")
        return self.shortcuts(
            data.controls.argmax(-1),
            data.inputs.argmax(-1, keepdim=True),
            data.targets.argmax(-1, keepdim=True),
        )

    @property
    def floor(self) -> float:
        """The best guess that tracks nothing."""
        return max(self.shortcut_levels.values())

    @property
    def in_dim(self) -> int:
        return self.items

    @property
    def out_dim(self) -> int:
        return self.items

    @property
    def control_dim(self) -> int:
        return self.transpositions

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        steps = self.split_steps(split)
        words, item = self.held_out_words(n, steps, 1, split, split_generator(seed, split))
        where = self.positions(words).gather(2, item[:, None].expand(-1, steps + 1, 1))
        trajectory = F.one_hot(where[..., 0], self.items).float()  # (n, steps + 1, items)
        return TaskData(
            inputs=F.one_hot(item[:, 0], self.items).float(),
            targets=trajectory[:, -1],
            steps=steps,
            controls=F.one_hot(words, self.transpositions).float(),
            trajectory=trajectory,
            step_regimes=torch.full((n, steps), REGIMES.index("reflection")),
        )

    def metric(self, pred: Tensor, target: Tensor) -> float:
        """The share of examples whose largest read-out is at the item's final position."""
        return (pred.argmax(-1) == target.argmax(-1)).float().mean().item()
