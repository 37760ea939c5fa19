"""Variable binding chains: follow ``d=c``, ``c=b``, ``b=a``, ``a=3`` from a query ``d`` to 3.

A sequence lists assignments, one token each (``b=a``: a variable bound to a value or to
another variable), for ``chains`` chains of ``hops`` assignments each, interleaved at random
(each chain in program order: a variable is bound before it is referred to); then every
chain's last variable is queried once, in random order. The answer at a query is the value its
chain starts from. Resolving it takes ``hops`` look-ups, one per attention layer: the query
token's state must go from ``d`` to ``c`` to ``b`` to ``a`` to 3, each hop *replacing* the
referent the token holds (Wu, Geiger & Millière on variable binding; k-hop induction:
Sanford, Hsu & Telgarsky, ICML 2024). This is erase-and-rewrite over depth inside a
Transformer: the task asks whether the Delta block's gate projects (β ≈ 1) where a hop
replaces a referent. ``hops`` is the knob, from one look-up (associative recall) to as many as
the model has layers. An assignment is one token, so one attention layer can perform one hop
(with the variable and its referent in two tokens, as in ``mqar``, every hop would also need
a previous-token head, which a short convolution at the embedding supplies for free).

Options: ``reassign`` gives one variable of every chain an earlier, stale binding to a random
value, which the later one replaces (each hop must take the latest binding); ``negate`` makes
values bits and binds each reference negated (``b=!a``) with probability 1/2, so the answer's
bit flips at every negated hop. Only query positions are scored, and train, val and test hold
whole sequences out from each other (`held_out`).

Tokens: the values ``0 … V−1``; the variables ``V … V+N−1`` (asked at queries); then one
token per assignment ``name=referent``, the referent a value, a variable or (``negate``) a
negated variable. Layout (``chains = 2``, ``hops = 3``)::

    position  0    1    2    3    4    5    | 6   7
    inputs    a=3  x=5  b=a  y=x  c=b  z=y  | z?  c?
    targets   ·    ·    ·    ·    ·    ·    | 5   3
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ddl_dynamics import IGNORE_INDEX, Expectation, SequenceTask, Subject, register_task


@register_task("var-chain")
@dataclass(frozen=True)
class VarChain(SequenceTask):
    """Variable binding chains: one-token assignments, then a query of each chain's end.

    Spec: ``hops`` (assignments per chain: look-ups per query), ``chains``, ``variables``
    (the pool names are drawn from; None: ``chains · hops``, every name in every sequence),
    ``values``, ``reassign``, ``negate``; ``length`` follows from them (None, or that
    number; it and the default pool stay None in the spec, so that a sweep of ``hops`` is
    one setting of the knob). Accuracy on query positions only.
    """

    #: The sequence length; it follows from the chains (None, or that number).
    length: int | None = None
    #: Assignments per chain: the look-ups a query takes (the knob).
    hops: int = 2
    #: Chains per sequence, interleaved at random; each chain's end is queried once.
    chains: int = 2
    #: The pool variable names are drawn from (None: chains · hops, every name in use).
    variables: int | None = None
    #: The values a chain starts from (2: bits, as negate needs).
    values: int = 4
    #: One variable of every chain first gets a stale binding, which a later one replaces.
    reassign: bool = False
    #: A reference is negated (b=!a) with probability 1/2, flipping the answer's bit.
    negate: bool = False

    regime: ClassVar = (
        "hypothesis: each hop replaces the referent the query token holds, so "
        "the Delta block's gate at the hopping layer projects (β ≈ 1)"
    )
    regimes: ClassVar = ("projection",)
    knob: ClassVar = "hops"
    has_hops: ClassVar = True
    expectations: ClassVar = (
        Expectation(
            Subject("ddl-transformer"),
            "better",
            Subject("ddl-write-transformer"),
            "the erase term matters: a hop overwrites the referent held in the query token's "
            "state; with β = 1 along the old referent one delta update is that overwrite, "
            "while a write-only update leaves the old referent beside the new one",
        ),
        Expectation(
            Subject("ddl-transformer"),
            "better",
            Subject("transformer"),
            "an additive residual keeps every referent the query token has held, and the "
            "next look-up must tell the current one from the stale ones; the delta rule "
            "erases them",
        ),
    )

    def __post_init__(self) -> None:
        if self.hops < 1 or self.chains < 1:
            raise ValueError(f"hops and chains must be at least 1, got {self.hops}, {self.chains}")
        if self.pool < self.hops * self.chains:
            raise ValueError(
                f"variables must be at least hops · chains = "
                f"{self.hops * self.chains} (a name per assignment), got "
                f"{self.variables}"
            )
        if self.values < 2 or (self.negate and self.values != 2):
            raise ValueError(
                f"values must be at least 2, and 2 (bits) with negate; got {self.values}"
            )
        if self.length not in (None, self.sequence_length):
            raise ValueError(
                f"length follows from the chains: chains · (hops + reassign + 1) "
                f"= {self.sequence_length}; got {self.length}"
            )

    # Derived sizes stay out of the spec, so that a sweep of hops is one setting of the knob.
    @property
    def pool(self) -> int:
        """How many variable names there are."""
        return self.hops * self.chains if self.variables is None else self.variables

    @property
    def sequence_length(self) -> int:
        """The assignments, then a query per chain."""
        return self.chains * (self.hops + self.reassign + 1)

    @property
    def floor(self) -> float:
        """The shortcut that follows no chain: answering a query with the value of a random
        one of the sequence's value bindings (each chain's start, and with ``reassign`` each
        chain's stale binding too). Right where that binding is the query's own chain's
        start, else where its value happens to be the answer (1 in ``values``): 1/2 + 1/2 ·
        1/4 = 0.625 at 2 chains and 4 values, 1/4 + 3/4 · 1/4 = 0.4375 with ``reassign``.
        With ``negate`` past one hop the answer is a fair coin to anything not resolving
        the chain: 1/2."""
        if self.negate and self.hops > 1:
            return 1 / self.values
        bindings = self.chains * (1 + self.reassign)
        return 1 / bindings + (1 - 1 / bindings) / self.values

    def split_steps(self, split: str) -> int:
        self.check_split(split)
        return self.sequence_length

    @property
    def referents(self) -> int:
        """What a variable can be bound to: a value, a variable or a negated variable."""
        return self.values + self.pool * (2 if self.negate else 1)

    @property
    def in_dim(self) -> int:
        return self.values + self.pool + self.pool * self.referents

    @property
    def out_dim(self) -> int:
        return self.in_dim

    def assignment(self, name: Tensor, referent: Tensor) -> Tensor:
        """The token of ``name=referent``; ``name`` and ``referent`` are variable and referent
        indices (a referent ``r < values`` is that value, then variables, then negated ones)."""
        return self.values + self.pool + name * self.referents + referent

    def tokens(self, n: int, T: int, g: torch.Generator) -> Tensor:
        """``n`` sequences: interleaved chains of assignments, then a query of every chain."""
        C, h, stale, V = self.chains, self.hops, int(self.reassign), self.values
        names = torch.rand(n, self.pool, generator=g).argsort(1)[:, : C * h].view(n, C, h)
        referents = torch.empty_like(names)  # chain c binds names[:, c, 0] first
        referents[:, :, 0] = torch.randint(0, V, (n, C), generator=g)
        referents[:, :, 1:] = names[:, :, :-1] + V
        if self.negate:
            negated = torch.rand(n, C, h - 1, generator=g) < 0.5
            referents[:, :, 1:] += negated * self.pool
        events = self.assignment(names, referents)  # (n, C, h): each chain's assignments
        if stale:  # an earlier binding of one name per chain, to a random value
            which = torch.randint(0, h, (n, C), generator=g)
            old = self.assignment(
                names.gather(2, which[..., None])[..., 0], torch.randint(0, V, (n, C), generator=g)
            )
            place = (torch.rand(n, C, generator=g) * (which + 1)).long()  # at or before it
            slot = torch.arange(h + 1).expand(n, C, h + 1)
            events = events.gather(2, slot - (slot > place[..., None]).long())
            events.scatter_(2, place[..., None], old[..., None])
        # interleave the chains at random, each in its own order
        per_chain = h + stale
        chain_of = torch.arange(C).repeat_interleave(per_chain).expand(n, -1)
        chain_of = chain_of.gather(1, torch.rand(n, C * per_chain, generator=g).argsort(1))
        rank = torch.zeros_like(chain_of)  # the k-th slot of chain c takes its k-th event
        for c in range(C):
            mine = chain_of == c
            rank[mine] = (mine.cumsum(1) - 1)[mine]
        program = events.flatten(1).gather(1, chain_of * per_chain + rank)
        asked = names[:, :, -1].gather(1, torch.rand(n, C, generator=g).argsort(1)) + V
        return torch.cat([program, asked], dim=1)

    def resolve(self, inputs: Tensor) -> tuple[Tensor, Tensor]:
        """Every query's answer ``(n, chains)`` and the positions of the assignments it
        reads, one per hop, ``(n, chains, hops)``: at each hop the latest binding of the
        variable it holds (each negation flips the bit)."""
        start, V, N = self.sequence_length - self.chains, self.values, self.pool
        program = inputs[:, :start] - V - N  # assignment index: name · referents + referent
        names, bound = program // self.referents, program % self.referents
        position = torch.arange(start)
        held = inputs[:, start:] - V  # the variable each query holds
        flips, read = torch.zeros_like(held), []
        for _ in range(self.hops):
            match = names[:, None, :] == held[..., None]  # (n, queries, program)
            read.append(torch.where(match, position, -1).amax(-1))
            step = bound.gather(1, read[-1])
            flips ^= (step >= V + N).long()
            held = torch.where(step < V, step, (step - V) % N)
        return (held ^ flips if self.negate else held), torch.stack(read, dim=-1)

    def answers(self, inputs: Tensor) -> Tensor:
        """At every query, the value its variable resolves to; IGNORE_INDEX elsewhere."""
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, self.sequence_length - self.chains :] = self.resolve(inputs)[0]
        return targets

    def hop_positions(self, inputs: Tensor) -> Tensor:
        """Per token ``(n, T, hops)``: at a query, the position of the assignment each hop
        reads; −1 at every other token."""
        where = torch.full((*inputs.shape, self.hops), -1)
        where[:, self.sequence_length - self.chains :] = self.resolve(inputs)[1]
        return where
