"""The character-level language model on the standard library's source: held-out blocks,
deterministic windows, the text's pin, the metric in bits, and a small model that learns more
than the characters' frequencies."""

import math

import pytest
import torch
from ddl_dynamics.tasks.char_lm import BLOCK, PATTERN, stdlib_source

from ddl_dynamics import check_task, make_model, make_task

TASK = make_task("char-lm", length=32, vocab=64)


def test_the_splits_are_disjoint_blocks_in_the_held_out_shares():
    blocks = {split: TASK.blocks(split) for split in ("train", "val", "test")}
    total = sum(len(b) for b in blocks.values())
    assert total == len(stdlib_source()[0].decode()) // BLOCK  # every whole block, once
    assert len(blocks["val"]) == pytest.approx(0.1 * total, abs=1)
    assert len(blocks["test"]) == pytest.approx(0.2 * total, abs=2)
    rows = {split: {tuple(row.tolist()) for row in b} for split, b in blocks.items()}
    assert not rows["train"] & rows["val"] and not rows["train"] & rows["test"]
    assert not rows["val"] & rows["test"]
    assert PATTERN.count("val") == 1 and PATTERN.count("test") == 2


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_windows_lie_in_their_splits_blocks_and_targets_are_the_next_character(split):
    data = TASK.sample(64, seed=3, split=split)
    assert data.inputs.shape == data.targets.shape == (64, 32) and data.steps == 32
    assert torch.equal(data.inputs[:, 1:], data.targets[:, :-1])
    text = [bytes(row.tolist()) for row in TASK.blocks(split).to(torch.uint8)]
    for inputs, targets in zip(data.inputs, data.targets, strict=True):
        window = bytes(torch.cat([inputs, targets[-1:]]).to(torch.uint8).tolist())
        assert any(window in block for block in text)


@pytest.mark.parametrize("split", ["val", "test"])
def test_no_held_out_window_repeats_training_text(split):
    """Held out by content: the standard library repeats itself, and a val or test window
    whose text occurs among the training blocks would be a training example."""
    train = [bytes(row.tolist()) for row in TASK.blocks("train").to(torch.uint8)]
    for seed in range(8):
        data = TASK.sample(256, seed=seed, split=split)
        for inputs, targets in zip(data.inputs, data.targets, strict=True):
            window = bytes(torch.cat([inputs, targets[-1:]]).to(torch.uint8).tolist())
            assert not any(window in block for block in train)


def test_sampling_is_a_pure_function_of_seed_and_split():
    again = make_task("char-lm", length=32, vocab=64)
    for split in ("train", "val"):
        assert torch.equal(TASK.sample(16, 0, split).inputs, again.sample(16, 0, split).inputs)
    assert not torch.equal(TASK.sample(16, 0, "train").inputs, TASK.sample(16, 1, "train").inputs)
    assert not torch.equal(TASK.sample(16, 0, "train").inputs, TASK.sample(16, 0, "val").inputs)
    check_task(TASK)


def test_a_text_other_than_the_pinned_one_is_one_clear_error():
    found = stdlib_source()[1]
    with pytest.raises(ValueError, match=f"SHA-256 {found}, not the pinned 0+ .*sha256 = "):
        make_task("char-lm", sha256="0" * 64).sample(1, 0)
    assert make_task("char-lm", sha256=found, vocab=8).sample(2, 0).inputs.max() < 8


def test_the_vocabulary_keeps_the_most_frequent_characters_and_one_id_for_the_rest():
    small = make_task("char-lm", vocab=3)
    ids = torch.cat([small.blocks(s).flatten() for s in ("train", "val", "test")])
    assert set(ids.unique().tolist()) == {0, 1, 2}
    train = small.blocks("train").flatten()
    counts = torch.bincount(train, minlength=3)
    assert counts[0] >= counts[1]  # id 0 the most frequent character (the space)
    assert small.unigram_entropy() < math.log2(3)


def test_bits_per_character():
    targets = TASK.sample(8, 0).targets
    uniform = torch.zeros(8, 32, 64)
    assert TASK.metric(uniform, targets) == pytest.approx(math.log2(64))
    assert not TASK.higher_is_better and TASK.equivalence_margin(2.0) == 0.01


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"length": BLOCK}, "length must lie in"),
        ({"length": 0}, "length must lie in"),
        ({"vocab": 1}, "vocab must be at least 2"),
    ],
)
def test_bad_specs_fail_with_one_clear_message(spec, message):
    with pytest.raises(ValueError, match=message):
        make_task("char-lm", **spec)


def test_a_small_transformer_learns_more_than_the_character_frequencies():
    """Unigram statistics alone give the training text's unigram entropy; a one-block model
    trained briefly reads its context and goes below it on held-out text."""
    torch.manual_seed(0)
    model = make_model("transformer", in_dim=64, out_dim=64, width=32, depth=1, heads=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data, val = TASK.sample(4096, 0, "train"), TASK.sample(256, 0, "val")
    for step in range(150):
        rows = slice(32 * step % 4096, 32 * step % 4096 + 32)
        loss = TASK.loss(model(data.inputs[rows]), data.targets[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        bpc = TASK.metric(model(val.inputs), val.targets)
    assert bpc < TASK.unigram_entropy() - 0.3, (bpc, TASK.unigram_entropy())
