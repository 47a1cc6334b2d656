"""Fine-tuning heads: output shapes and losses of every target kind, pooling, padding invariance,
the reverse-complement helpers against numpy, and strand symmetry of test-time strand averaging
(including the swap_strands shortcut against really running the reverse complement)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from genoformer.data.genome.alphabet import PAD, reverse_complement
from genoformer.data.genome.annotations import ANNOTATION_CLASSES, STRAND_SWAP
from genoformer.data.genome.labelled import IGNORE
from genoformer.data.genome.targets import TargetKind, TargetSpace
from model_helpers import random_tokens

from genoformer.genome.finetune import FineTuner
from genoformer.genome.heads import (
    BaseHead,
    HeadPooling,
    HeadSettings,
    SequenceHead,
    StrandSettings,
    flip_within,
    positions_within,
    reverse_complement_rows,
    strand_features,
    swap_strands,
    valid_mask,
)

SPACES = {
    "binary": TargetSpace(TargetKind.SEQUENCE_CLASSES, ("neg", "pos")),
    "multiclass": TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b", "c")),
    "multilabel": TargetSpace(TargetKind.SEQUENCE_LABELS, ("x", "y", "z")),
    "values": TargetSpace(TargetKind.SEQUENCE_VALUES, ("v1", "v2"), mean=(10.0, -2.0), std=(3.0, 0.5)),
    "base_classes": TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP),
    "base_values": TargetSpace(TargetKind.BASE_VALUES, ("signal",), mean=(1.5,), std=(2.0,)),
}
LENGTHS = torch.tensor([40, 33, 21, 40])


def padded_batch(lengths=LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) uint8 tokens of A C G T N, PAD beyond each row's length."""
    tokens_BL = random_tokens(len(lengths), int(max(lengths)), seed=seed, high=5)
    tokens_BL[valid_mask(lengths, tokens_BL.shape[1]).logical_not()] = PAD
    return tokens_BL, lengths


def targets_for(space: TargetSpace, lengths: torch.Tensor, seq_len: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    B, K = len(lengths), space.outputs
    if space.kind is TargetKind.SEQUENCE_CLASSES:
        return torch.randint(0, K, (B,), generator=g)
    if space.kind is TargetKind.SEQUENCE_LABELS:
        return torch.randint(0, 2, (B, K), generator=g).float()
    if space.kind is TargetKind.SEQUENCE_VALUES:
        return torch.tensor(space.mean) + torch.tensor(space.std) * torch.randn(B, K, generator=g)
    keep_BL = valid_mask(lengths, seq_len)
    if space.kind is TargetKind.BASE_CLASSES:
        return torch.randint(0, K, (B, seq_len), generator=g).masked_fill(~keep_BL, IGNORE)
    values = space.mean[0] + space.std[0] * torch.randn(B, seq_len, generator=g)
    return values.masked_fill(~keep_BL, float("nan"))


def tuner(checkpoint, space: TargetSpace, pooling: HeadPooling = HeadPooling.MEAN, **options) -> FineTuner:
    torch.manual_seed(0)
    head = HeadSettings(pooling=pooling, dropout=0.0)
    return FineTuner(pretrained=str(checkpoint), targets=space.to_dict(), head=head, **options).eval()


# ------------------------------------------------------------------ shapes and losses per target kind
@pytest.mark.parametrize("name", list(SPACES))
def test_every_head_shapes_and_a_loss_that_falls(causal_checkpoint, name):
    space = SPACES[name]
    module = tuner(causal_checkpoint, space)
    tokens_BL, lengths_B = padded_batch()
    B, L = tokens_BL.shape
    K = space.outputs
    expected = (B, L, K) if space.kind.per_base else (B, K)
    outputs = module(tokens_BL, lengths_B)
    assert outputs.shape == expected and outputs.dtype == torch.float32
    with torch.no_grad():
        predictions = module.predict_outputs(tokens_BL, lengths_B)
    assert predictions.shape == expected
    if space.kind.classes:
        torch.testing.assert_close(predictions.sum(-1), torch.ones(predictions.shape[:-1]))
    if space.kind is TargetKind.SEQUENCE_LABELS:
        assert ((predictions >= 0) & (predictions <= 1)).all()
    targets = targets_for(space, lengths_B, L)
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(6):
        loss = module.loss(module(tokens_BL, lengths_B), targets)
        assert torch.isfinite(loss) and loss.ndim == 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", ["values", "base_values"])
def test_values_are_predicted_in_the_data_units(causal_checkpoint, name):
    space = SPACES[name]
    module = tuner(causal_checkpoint, space, strands=StrandSettings(test_time=False))
    tokens_BL, lengths_B = padded_batch()
    with torch.no_grad():
        standardised = module(tokens_BL, lengths_B)
        values = module.predict_outputs(tokens_BL, lengths_B)
    torch.testing.assert_close(values, standardised * torch.tensor(space.std) + torch.tensor(space.mean))
    # the loss is the MSE of standardised values: targets equal to the predictions give 0
    targets = values if name == "values" else values.squeeze(-1)
    assert module.loss(standardised, targets).item() == pytest.approx(0.0, abs=1e-8)


def test_per_base_losses_skip_padding(causal_checkpoint):
    tokens_BL, lengths_B = padded_batch()
    L = tokens_BL.shape[1]
    keep_BL = valid_mask(lengths_B, L)
    for name in ("base_classes", "base_values"):
        module = tuner(causal_checkpoint, SPACES[name])
        targets = targets_for(SPACES[name], lengths_B, L)
        with torch.no_grad():
            outputs = module(tokens_BL, lengths_B)
            loss = module.loss(outputs, targets)
            garbage = outputs.clone()
            garbage[~keep_BL] = 1e4  # outputs at padded positions never count
            assert module.loss(garbage, targets).item() == pytest.approx(loss.item(), rel=1e-6)


# ------------------------------------------------------------------ pooling
@pytest.mark.parametrize("both_strands", [False, True])
@pytest.mark.parametrize("pooling", list(HeadPooling))
def test_pooling_shapes_and_values(pooling, both_strands):
    torch.manual_seed(0)
    B, L, F, K = 3, 7, 8, 5
    features_BLF = torch.randn(B, L, F)
    lengths_B = torch.tensor([7, 4, 1])
    head = SequenceHead(F, K, pooling, both_strands=both_strands, dropout=0.0)
    pooled_BF = head.pool(features_BLF, lengths_B)
    assert pooled_BF.shape == (B, F)
    assert head(features_BLF, lengths_B).shape == (B, K)
    if both_strands:
        assert head(features_BLF, lengths_B, other_strand=True).shape == (B, K)
    for b, n in enumerate(lengths_B.tolist()):
        real_LF = features_BLF[b, :n]
        if pooling is HeadPooling.LAST:
            expected = real_LF[-1] if not both_strands else torch.cat([real_LF[-1, : F // 2], real_LF[0, F // 2 :]])
        else:  # ATTENTION starts with a zero query: uniform weights, the mean
            expected = real_LF.mean(0)
        torch.testing.assert_close(pooled_BF[b], expected)
    assert HeadPooling(pooling.value.lower()) is pooling


def test_attention_pooling_ignores_padding_with_a_trained_query():
    torch.manual_seed(1)
    head = SequenceHead(6, 2, HeadPooling.ATTENTION, both_strands=False, dropout=0.0)
    with torch.no_grad():
        head.query.normal_()
    features_BLF = torch.randn(2, 9, 6)
    lengths_B = torch.tensor([5, 9])
    pooled = head.pool(features_BLF, lengths_B)
    alone = head.pool(features_BLF[:1, :5], lengths_B[:1])
    torch.testing.assert_close(pooled[:1], alone)
    weights = torch.softmax(features_BLF[0, :5] @ head.query / 6**0.5, 0)
    torch.testing.assert_close(pooled[0], weights @ features_BLF[0, :5])


def test_base_head_shape():
    head = BaseHead(8, 5, dropout=0.0)
    assert head(torch.randn(2, 11, 8)).shape == (2, 11, 5)


# ------------------------------------------------------------------ padding invariance
@pytest.mark.parametrize("pooling", list(HeadPooling))
@pytest.mark.parametrize("fixture", ["causal_checkpoint", "mlm_checkpoint"])
def test_a_prediction_does_not_depend_on_the_padding(request, fixture, pooling):
    checkpoint = request.getfixturevalue(fixture)
    module = tuner(checkpoint, SPACES["multiclass"], pooling=pooling)
    tokens_BL, lengths_B = padded_batch(torch.tensor([70, 23]), seed=3)
    with torch.no_grad():
        batch = module.predict_outputs(tokens_BL, lengths_B)
        alone = module.predict_outputs(tokens_BL[1:, :23], lengths_B[1:])
        raw_batch, raw_alone = module(tokens_BL, lengths_B), module(tokens_BL[1:, :23], lengths_B[1:])
    torch.testing.assert_close(batch[1:], alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(raw_batch[1:], raw_alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fixture", ["causal_checkpoint", "mlm_checkpoint"])
def test_per_base_prediction_does_not_depend_on_the_padding(request, fixture):
    module = tuner(request.getfixturevalue(fixture), SPACES["base_classes"])
    tokens_BL, lengths_B = padded_batch(torch.tensor([70, 23]), seed=4)
    with torch.no_grad():
        batch = module.predict_outputs(tokens_BL, lengths_B)
        alone = module.predict_outputs(tokens_BL[1:, :23], lengths_B[1:])
    torch.testing.assert_close(batch[1:, :23], alone, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ reverse-complement helpers
def test_flip_within_and_reverse_complement_rows_match_numpy():
    tokens_BL, lengths_B = padded_batch(torch.tensor([13, 1, 8, 13, 5]), seed=5)
    rc_BL = reverse_complement_rows(tokens_BL, lengths_B)
    flipped_BL = flip_within(tokens_BL, lengths_B)
    for b, n in enumerate(lengths_B.tolist()):
        row = tokens_BL[b, :n].numpy()
        np.testing.assert_array_equal(rc_BL[b, :n].numpy(), reverse_complement(row))
        np.testing.assert_array_equal(flipped_BL[b, :n].numpy(), row[::-1])
        assert (rc_BL[b, n:] == PAD).all() and (flipped_BL[b, n:] == PAD).all()
    # an involution; works on trailing feature dimensions too
    torch.testing.assert_close(reverse_complement_rows(rc_BL, lengths_B).long(), tokens_BL.long())
    x_BLF = torch.randn(5, 13, 3)
    flipped_BLF = flip_within(x_BLF, lengths_B)
    for b, n in enumerate(lengths_B.tolist()):
        torch.testing.assert_close(flipped_BLF[b, :n], x_BLF[b, :n].flip(0))
        torch.testing.assert_close(flipped_BLF[b, n:], x_BLF[b, n:])
    assert positions_within(torch.tensor([3]), 5).tolist() == [[2, 1, 0, 3, 4]]


def test_swap_strands_halves():
    x = torch.arange(6.0).view(1, 6)
    assert swap_strands(x).tolist() == [[3.0, 4.0, 5.0, 0.0, 1.0, 2.0]]
    torch.testing.assert_close(swap_strands(swap_strands(x)), x)


# ------------------------------------------------------------------ strand symmetry
def rc_batch(tokens_BL, lengths_B):
    return reverse_complement_rows(tokens_BL, lengths_B).to(torch.uint8), lengths_B


@pytest.mark.parametrize("pooling", list(HeadPooling))
@pytest.mark.parametrize("fixture", ["causal_checkpoint", "mlm_checkpoint"])
def test_test_time_strands_make_sequence_predictions_strand_symmetric(request, fixture, pooling):
    module = tuner(request.getfixturevalue(fixture), SPACES["multiclass"], pooling=pooling)
    assert module.both_strands is (fixture == "causal_checkpoint")
    if pooling is HeadPooling.ATTENTION:
        with torch.no_grad():
            module.head.query.normal_()
    tokens_BL, lengths_B = padded_batch(seed=6)
    with torch.no_grad():
        forward = module.predict_outputs(tokens_BL, lengths_B)
        reverse = module.predict_outputs(*rc_batch(tokens_BL, lengths_B))
        # without averaging the strands differ (so the check above is not vacuous)
        module.test_time_strands = False
        one_strand = module.predict_outputs(tokens_BL, lengths_B)
        other_strand = module.predict_outputs(*rc_batch(tokens_BL, lengths_B))
    torch.testing.assert_close(forward, reverse, atol=1e-5, rtol=0)
    assert not torch.allclose(one_strand, other_strand, atol=1e-4)


@pytest.mark.parametrize("fixture", ["causal_checkpoint", "mlm_checkpoint"])
def test_per_base_class_predictions_flip_and_swap_strand_classes(request, fixture):
    space = SPACES["base_classes"]
    module = tuner(request.getfixturevalue(fixture), space)
    tokens_BL, lengths_B = padded_batch(seed=7)
    with torch.no_grad():
        forward = module.predict_outputs(tokens_BL, lengths_B)
        reverse = module.predict_outputs(*rc_batch(tokens_BL, lengths_B))
    expected = flip_within(forward, lengths_B)[..., list(space.swap())]
    keep = valid_mask(lengths_B, tokens_BL.shape[1])
    torch.testing.assert_close(reverse[keep], expected[keep], atol=1e-5, rtol=0)
    assert space.swap() == (0, 2, 1, 3, 4)


def test_strand_features_of_the_reverse_complement_are_swapped_and_flipped(causal_checkpoint):
    """f(rc x)[L-1-i] = swap(f(x)[i]): what lets predict_outputs skip the second trunk pass."""
    module = tuner(causal_checkpoint, SPACES["binary"])
    tokens_BL, lengths_B = padded_batch(seed=8)
    with torch.no_grad():
        f_BLF = strand_features(module.model, tokens_BL.long(), lengths_B, both_strands=True)
        f_rc_BLF = strand_features(
            module.model, reverse_complement_rows(tokens_BL, lengths_B), lengths_B, both_strands=True
        )
    keep = valid_mask(lengths_B, tokens_BL.shape[1])
    torch.testing.assert_close(flip_within(f_rc_BLF, lengths_B)[keep], swap_strands(f_BLF)[keep], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "space_name,pooling",
    [
        ("multiclass", HeadPooling.MEAN),
        ("multiclass", HeadPooling.LAST),
        ("multiclass", HeadPooling.ATTENTION),
        ("base_classes", None),
        ("base_values", None),
        ("values", HeadPooling.LAST),
    ],
)
def test_swap_strands_shortcut_equals_running_the_reverse_complement(causal_checkpoint, space_name, pooling):
    """predict_outputs with test_time_strands (one trunk pass) equals the mean of the one-strand
    predictions of x and of rc(x) computed by running the trunk on rc(x)."""
    space = SPACES[space_name]
    module = tuner(causal_checkpoint, space, pooling=pooling or HeadPooling.MEAN)
    if pooling is HeadPooling.ATTENTION:
        with torch.no_grad():
            module.head.query.normal_()
    tokens_BL, lengths_B = padded_batch(seed=9)
    with torch.no_grad():
        shortcut = module.predict_outputs(tokens_BL, lengths_B)
        module.test_time_strands = False
        forward = module.predict_outputs(tokens_BL, lengths_B)
        reverse = module.predict_outputs(*rc_batch(tokens_BL, lengths_B))
    if space.kind.per_base:
        reverse = flip_within(reverse, lengths_B)[..., list(space.swap())]
        keep = valid_mask(lengths_B, tokens_BL.shape[1])
        shortcut, forward, reverse = shortcut[keep], forward[keep], reverse[keep]
    torch.testing.assert_close(shortcut, 0.5 * (forward + reverse), atol=1e-5, rtol=0)
