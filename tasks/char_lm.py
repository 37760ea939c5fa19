"""Character-level language modelling on the Python standard library's own source.

The text needs no download: a fixed list of pure-Python modules read from the running
interpreter's standard library, pinned by the SHA-256 of the bytes read (another Python
release ships other bytes; a mismatch is one error naming both hashes, and ``sha256`` in the
spec accepts another text knowingly). The text is cut into contiguous blocks of
`BLOCK` characters, and a fixed pattern over every ten blocks gives one to val and two
to test (the shares other tasks hold out): a window never crosses a block, so no
character of val or test text is ever seen in training; and since source code repeats
itself (licence headers, idioms), a val or test window whose text also occurs in the
training blocks is never drawn. The tail past the last whole block is left out.

Each example is a window of ``length`` characters; the target at every position is the next
character. The vocabulary is the ``vocab − 1`` most frequent characters of the training text
(ties by code point) and one id for every other character. The metric is bits per character
(the cross entropy in bits, lower is better), the quantity behind the paper's headline
language-modelling comparison (Table 3: FineWeb-Edu validation loss, baseline against the
Delta block at d_v = 1 and d_v = 4), here at a scale two cores can train.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ddl_dynamics import (
    IGNORE_INDEX,
    Expectation,
    Subject,
    Task,
    TaskData,
    register_task,
    split_generator,
)
from ddl_dynamics._task import MAX_OVERLAP

#: The standard-library modules read, in this order (pure Python, present since 3.8).
MODULES = (
    "argparse.py",
    "ast.py",
    "bisect.py",
    "calendar.py",
    "colorsys.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "inspect.py",
    "ipaddress.py",
    "pprint.py",
    "queue.py",
    "shlex.py",
    "statistics.py",
    "string.py",
    "textwrap.py",
    "tokenize.py",
)
#: SHA-256 of the bytes of `MODULES`, read in order, from CPython 3.11.7.
PINNED = "8a2c6671983c3219b11c101932de09ab67002db48e1206960076fef8cf9759ca"
#: Characters per block: the unit that train, val and test are split by.
BLOCK = 4096
#: The owner of block ``b`` is ``PATTERN[b % 10]``: one in ten to val, two to test.
PATTERN = ("train", "train", "test", "train", "val", "train", "train", "test", "train", "train")


def stdlib_source(modules: tuple[str, ...] = MODULES) -> tuple[bytes, str]:
    """The bytes of ``modules`` from this interpreter's standard library, concatenated in
    order, and their SHA-256."""
    root = Path(sysconfig.get_path("stdlib"))
    data = b"".join((root / name).read_bytes() for name in modules)
    return data, hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=4)
def _corpus(sha256: str, vocab: int) -> tuple[dict[str, Tensor], Tensor]:
    """Each split's blocks as ids ``(blocks, BLOCK)``, and the unigram distribution of the
    training text over the vocabulary; checked against ``sha256``."""
    data, found = stdlib_source()
    if found != sha256:
        raise ValueError(
            f"char-lm: the standard-library text read from {sysconfig.get_path('stdlib')} has "
            f"SHA-256 {found}, not the pinned {sha256} (another Python release); set the "
            f"task's sha256 = {found!r} to train on this text knowingly"
        )
    text = data.decode("utf-8")
    blocks = [text[i : i + BLOCK] for i in range(0, len(text) - BLOCK + 1, BLOCK)]
    owner = [PATTERN[b % len(PATTERN)] for b in range(len(blocks))]
    counts = Counter("".join(b for b, o in zip(blocks, owner, strict=True) if o == "train"))
    kept = sorted(counts, key=lambda ch: (-counts[ch], ord(ch)))[: vocab - 1]
    ids = {ch: i for i, ch in enumerate(kept)}
    other = vocab - 1
    splits = {
        split: torch.tensor(
            [
                [ids.get(ch, other) for ch in block]
                for block, o in zip(blocks, owner, strict=True)
                if o == split
            ],
            dtype=torch.long,
        )
        for split in ("train", "val", "test")
    }
    unigram = torch.bincount(splits["train"].flatten(), minlength=vocab).double()
    return splits, unigram / unigram.sum()


@functools.lru_cache(maxsize=8)
def _unseen_starts(sha256: str, vocab: int, length: int, split: str) -> tuple[Tensor, Tensor]:
    """The (block, start) of every window of ``length + 1`` characters of ``split`` whose
    text occurs nowhere in the training blocks."""
    splits = _corpus(sha256, vocab)[0]
    train, rows = _as_bytes(splits["train"]), _as_bytes(splits[split])
    width = length + 1
    seen = {row[2 * i : 2 * (i + width)] for row in train for i in range(BLOCK - width + 1)}
    kept = [
        (b, i)
        for b, row in enumerate(rows)
        for i in range(BLOCK - length)
        if row[2 * i : 2 * (i + width)] not in seen
    ]
    if not kept:
        raise ValueError(
            f"char-lm: every {split} window of {width} characters also occurs in the training text"
        )
    # held out by content as the suite checks it, by the context alone: a short context
    # recurs in source code followed by another character
    contexts = {rows[b][2 * i : 2 * (i + length)] for b, i in kept}
    recurring = {
        window
        for row in train
        for i in range(BLOCK - length + 1)
        if (window := row[2 * i : 2 * (i + length)]) in contexts
    }
    shared = sum(rows[b][2 * i : 2 * (i + length)] in recurring for b, i in kept) / len(kept)
    if shared > MAX_OVERLAP:
        raise ValueError(
            f"char-lm: at length {length} and vocab {vocab}, {shared:.0%} of the "
            f"{split} windows have a context that also occurs in the training "
            f"text (at most {MAX_OVERLAP:.0%}, or they are not held out): source "
            "code repeats itself over short contexts; use a longer length"
        )
    which, start = torch.tensor(kept, dtype=torch.long).T
    return which, start


def _as_bytes(blocks: Tensor) -> list[bytes]:
    """Each block's ids as bytes, two per id, so that windows compare as byte strings."""
    return [row.tobytes() for row in blocks.numpy().astype("<u2")]


@register_task("char-lm")
@dataclass(frozen=True)
class CharLM(Task):
    """Next-character prediction on the standard library's source, held out by block.

    Spec: ``length`` (the context, characters per window, at most ``BLOCK − 1``), ``vocab``
    (ids: the most frequent training characters, and one for the rest), ``sha256`` (the text's
    pin). Metric: bits per character over every position.
    """

    length: int = 64
    vocab: int = 96
    sha256: str = PINNED

    regime: ClassVar = (
        "real text: the paper's headline language-modelling comparison, at two cores' scale"
    )
    kind: ClassVar = "sequence"
    loss_name: ClassVar = "ce"
    metric_name: ClassVar = "bpc"
    supervise: ClassVar[Literal["final", "trajectory"]] = "trajectory"
    #: Models within 0.01 bits per character of each other are practically equal.
    margin: ClassVar = (0.0, 0.01)
    expectations: ClassVar = (
        Expectation(
            Subject("ddl-transformer", {"value_channels": 1}),
            "better",
            Subject("transformer"),
            "the paper's Table 3: at 124M parameters the Delta block at d_v = 1 reaches a "
            "FineWeb-Edu validation loss of 2.8482 against the baseline's 2.8543 (one run each)",
        ),
        Expectation(
            Subject("ddl-transformer", {"value_channels": 4}),
            "better",
            Subject("transformer"),
            "the paper's Table 3: the d_v = 4 block (EC, CC and the expanded state, not the "
            "delta rule alone) reaches 2.8329 against the baseline's 2.8543 (one run each)",
        ),
    )

    def __post_init__(self) -> None:
        if not 1 <= self.length < BLOCK:
            raise ValueError(
                f"length must lie in [1, {BLOCK - 1}] (a window and its next "
                f"character inside one block), got {self.length}"
            )
        if self.vocab < 2:
            raise ValueError(
                f"vocab must be at least 2 (a character and the rest), got {self.vocab}"
            )

    @property
    def in_dim(self) -> int:
        return self.vocab

    @property
    def out_dim(self) -> int:
        return self.vocab

    @property
    def floor(self) -> float:
        """Chance: a uniform guess over the ``vocab`` ids costs log₂(vocab) bits per
        character. (The unigram entropy, `unigram_entropy`, is no floor: a model reaches
        it by learning the text's character frequencies.)"""
        return math.log2(self.vocab)

    def split_steps(self, split: str) -> int:
        self.check_split(split)
        return self.length

    def blocks(self, split: str) -> Tensor:
        """The ids of ``split``'s blocks, ``(blocks, BLOCK)`` (the text read and checked once)."""
        self.check_split(split)
        return _corpus(self.sha256, self.vocab)[0][split]

    def unigram_entropy(self) -> float:
        """Bits per character of the training text's own unigram distribution: what a model
        that ignores the context can reach at best."""
        p = _corpus(self.sha256, self.vocab)[1]
        p = p[p > 0]
        return float(-(p * p.log2()).sum())

    def sample(self, n: int, seed: int, split: str = "train") -> TaskData:
        """``n`` windows of ``split``'s text, each inside one block, with the next character
        at every position as target. A val or test window is never one whose text also
        occurs in the training text (source code repeats itself: licence headers, idioms),
        so held-out data is held out by content, not only by position."""
        blocks, T = self.blocks(split), self.length
        g = split_generator(seed, split)
        if split == "train":
            which = torch.randint(0, blocks.shape[0], (n,), generator=g)
            start = torch.randint(0, BLOCK - T, (n,), generator=g)
        else:
            which, start = _unseen_starts(self.sha256, self.vocab, T, split)
            pick = torch.randint(0, len(which), (n,), generator=g)
            which, start = which[pick], start[pick]
        window = blocks[which[:, None], start[:, None] + torch.arange(T + 1)]
        return TaskData(inputs=window[:, :-1], targets=window[:, 1:], steps=T)

    def metric(self, pred: Tensor, target: Tensor) -> float:
        """Bits per character: the cross entropy over the scored positions, in bits."""
        nats = F.cross_entropy(
            pred.flatten(0, -2).float(), target.flatten(), ignore_index=IGNORE_INDEX
        )
        return nats.item() / math.log(2)
