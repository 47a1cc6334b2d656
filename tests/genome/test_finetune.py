"""FineTuner: what trains under full fine-tuning, a linear probe and LoRA (against the pretrained
checkpoint's weights, bit for bit), the head's own learning rate, strand augmentation, metrics per
target kind, checkpoint round trips and argument errors."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from genoformer.data.genome.alphabet import PAD, decode
from genoformer.data.genome.annotations import ANNOTATION_CLASSES, STRAND_SWAP
from genoformer.data.genome.labelled import IGNORE, LabelledDataModule
from genoformer.data.genome.targets import TargetKind, TargetSpace
from model_helpers import random_tokens

from genoformer.core.checkpoints import canonical_state_dict
from genoformer.genome.finetune import Adaptation, FineTuner
from genoformer.genome.heads import FineTunedNetwork, flip_within, reverse_complement_rows, valid_mask
from genoformer.genome.predict import FineTunedModel

CLASSES = TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b"))


def write_tsv(path: Path, n: int, seed: int, *, regress: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    header = "name\tsequence\tlabel_x\tlabel_y" if regress else "name\tsequence\tlabel"
    lines = [header]
    for i in range(n):
        length = int(rng.integers(24, 48))
        sequence = decode(rng.integers(0, 4, length).astype(np.uint8))
        if regress:
            lines.append(f"s{seed}_{i}\t{sequence}\t{rng.normal():.4f}\t{rng.normal(5, 2):.4f}")
        else:
            lines.append(f"s{seed}_{i}\t{sequence}\t{'ab'[i % 2]}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tables")
    return {
        "train": write_tsv(folder / "train.tsv", 24, 1),
        "val": write_tsv(folder / "val.tsv", 8, 2),
        "train_regress": write_tsv(folder / "train_r.tsv", 16, 3, regress=True),
        "val_regress": write_tsv(folder / "val_r.tsv", 8, 4, regress=True),
    }


def trainer(**options) -> L.Trainer:
    values = dict(
        accelerator="cpu",
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    values.update(options)
    return L.Trainer(**values)


def pretrained_trunk(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = canonical_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"])
    return {key[len("model.") :]: value for key, value in state.items() if key.startswith("model.")}


def trunk_name(name: str) -> str:
    """The trunk parameter's name in the pretrained checkpoint (peft wraps adapted layers)."""
    return name.replace(".base_layer", "")


def fine_tune(checkpoint: Path, tables: dict[str, Path], **options) -> tuple[FineTuner, dict[str, torch.Tensor]]:
    L.seed_everything(0, verbose=False)
    module = FineTuner(pretrained=str(checkpoint), warmup_steps=0, learning_rate=1e-2, **options)
    data = LabelledDataModule("classify", [str(tables["train"])], val=[str(tables["val"])], batch_size=4)
    trainer().fit(module, datamodule=data)
    return module, pretrained_trunk(checkpoint)


def test_lora_trains_adapters_and_head_only(causal_checkpoint, tables):
    module, pretrained = fine_tune(causal_checkpoint, tables, lora_rank=4)
    assert module.adaptation is Adaptation.LORA and module.targets == CLASSES
    adapters = {n: p for n, p in module.model.named_parameters() if "lora_" in n}
    assert adapters and all(p.requires_grad for p in adapters.values())
    assert {n.split(".")[-4] for n in adapters} >= {"wq", "wk", "wv", "wo", "w_gate_up", "w_down"}
    own = {n: p for n, p in module.model.named_parameters() if "lora_" not in n}
    assert {trunk_name(n) for n in own} <= set(pretrained)
    for name, param in own.items():
        assert torch.equal(param.detach(), pretrained[trunk_name(name)]), name
    # lora_B starts at zero: trained, it is not
    assert any(p.detach().abs().sum() > 0 for n, p in adapters.items() if "lora_B" in n)
    torch.manual_seed(0)
    untrained = FineTuner(pretrained=str(causal_checkpoint), lora_rank=4, targets=CLASSES.to_dict())
    assert not torch.equal(module.head.out.weight.detach(), untrained.head.out.weight)


def test_linear_probe_keeps_the_whole_trunk_and_full_changes_it(causal_checkpoint, tables):
    torch.manual_seed(0)
    fresh = FineTuner(pretrained=str(causal_checkpoint), targets=CLASSES.to_dict())
    probe, pretrained = fine_tune(causal_checkpoint, tables, freeze_backbone=True, targets=CLASSES.to_dict())
    assert probe.adaptation is Adaptation.LINEAR_PROBE
    for name, param in probe.model.named_parameters():
        assert torch.equal(param.detach(), pretrained[name]), name
    torch.manual_seed(0)
    same_init = FineTuner(pretrained=str(causal_checkpoint), targets=CLASSES.to_dict())
    assert torch.equal(fresh.head.out.weight, same_init.head.out.weight)
    assert not torch.equal(probe.head.out.weight.detach(), fresh.head.out.weight)  # the head trained

    full, pretrained = fine_tune(causal_checkpoint, tables)
    assert full.adaptation is Adaptation.FULL
    for name, param in full.model.blocks.named_parameters():
        assert not torch.equal(param.detach(), pretrained[f"blocks.{name}"]), name


def test_head_trains_at_its_own_learning_rate(causal_checkpoint):
    for options, head_rate in [({"head_learning_rate": 5e-3}, 5e-3), ({}, 10 * 2e-4)]:
        module = FineTuner(
            pretrained=str(causal_checkpoint), targets=CLASSES.to_dict(), learning_rate=2e-4, total_steps=10, **options
        )
        optimizer = module.configure_optimizers()["optimizer"]
        head_params = {id(p) for p in module.head.parameters()}
        rates = {}
        for group in optimizer.param_groups:
            ids = {id(p) for p in group["params"]}
            assert ids <= head_params or not ids & head_params  # a group is all head or all trunk
            rates.setdefault("head" if ids <= head_params else "trunk", set()).add(group["initial_lr"])
        assert rates == {"head": {head_rate}, "trunk": {2e-4}}
        grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
        assert head_params <= grouped


def test_linear_probe_and_lora_optimise_only_what_trains(causal_checkpoint):
    probe = FineTuner(pretrained=str(causal_checkpoint), targets=CLASSES.to_dict(), freeze_backbone=True, total_steps=5)
    groups = probe.configure_optimizers()["optimizer"].param_groups
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in probe.head.parameters()}
    lora = FineTuner(pretrained=str(causal_checkpoint), targets=CLASSES.to_dict(), lora_rank=2, total_steps=5)
    groups = lora.configure_optimizers()["optimizer"].param_groups
    expected = {id(p) for n, p in lora.model.named_parameters() if "lora_" in n} | {
        id(p) for p in lora.head.parameters()
    }
    assert {id(p) for g in groups for p in g["params"]} == expected


def test_random_strand_flips_tokens_and_per_base_targets_together(causal_checkpoint):
    space = TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)
    module = FineTuner(pretrained=str(causal_checkpoint), targets=space.to_dict())
    lengths_B = torch.tensor([30, 17, 25, 30, 9, 30, 22, 12])
    tokens_BL = random_tokens(8, 30, seed=2)
    keep = valid_mask(lengths_B, 30)
    tokens_BL[~keep] = PAD
    targets_BL = torch.randint(0, 5, (8, 30)).masked_fill(~keep, IGNORE)
    torch.manual_seed(0)
    new_tokens, new_targets = module._random_strand({"tokens": tokens_BL, "length": lengths_B, "targets": targets_BL})
    rc = reverse_complement_rows(tokens_BL, lengths_B).long()
    swapped = torch.tensor(STRAND_SWAP)[flip_within(targets_BL, lengths_B).clamp(min=0)]
    swapped = swapped.masked_fill(~keep, IGNORE)
    flipped_rows = []
    for b in range(8):
        if torch.equal(new_tokens[b].long(), tokens_BL[b].long()) and torch.equal(new_targets[b], targets_BL[b]):
            continue
        assert torch.equal(new_tokens[b].long(), rc[b]) and torch.equal(new_targets[b], swapped[b]), b
        flipped_rows.append(b)
    assert 0 < len(flipped_rows) < 8
    assert (new_targets[~keep] == IGNORE).all()


@pytest.mark.parametrize(
    "space,targets",
    [
        (TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b", "c")), torch.tensor([0, 1, 2, 1])),
        (TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b")), torch.tensor([0, 1, 1, 0])),
        (TargetSpace(TargetKind.SEQUENCE_LABELS, ("x", "y")), torch.tensor([[0, 1], [1, 1], [0, 0], [1, 0]]).float()),
        (TargetSpace(TargetKind.SEQUENCE_VALUES, ("v",), mean=(1.0,), std=(2.0,)), torch.randn(4, 1)),
        (TargetSpace(TargetKind.SEQUENCE_VALUES, ("v", "w"), mean=(1.0, 0.0), std=(2.0, 1.0)), torch.randn(4, 2)),
    ],
    ids=["multiclass", "binary", "labels", "one_value", "two_values"],
)
def test_evaluation_metrics_per_target_kind(causal_checkpoint, space, targets):
    module = FineTuner(pretrained=str(causal_checkpoint), targets=space.to_dict()).eval()
    lengths_B = torch.tensor([30, 20, 25, 30])
    tokens_BL = random_tokens(4, 30, seed=3)
    logged = {}
    module.log = lambda name, value, **kw: logged.__setitem__(name, value)
    module.log_dict = lambda values, **kw: logged.update(values)
    with torch.no_grad():
        module._evaluate({"tokens": tokens_BL, "length": lengths_B, "targets": targets}, "val")
    values = {name: float(metric.compute()) for name, metric in module.metrics["val"].items()}
    expected = {
        TargetKind.SEQUENCE_CLASSES: {"accuracy", "balanced_accuracy", "mcc", "f1", "auroc", "auprc"},
        TargetKind.SEQUENCE_LABELS: {"accuracy", "f1", "auroc", "auprc"},
        TargetKind.SEQUENCE_VALUES: {"pearson", "spearman", "mse"},
    }[space.kind]
    assert set(values) == expected and "val/loss" in logged
    assert all(np.isfinite(v) for v in values.values()), values


def test_per_base_metrics_skip_padding(causal_checkpoint):
    space = TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)
    module = FineTuner(pretrained=str(causal_checkpoint), targets=space.to_dict()).eval()
    module.log = module.log_dict = lambda *a, **k: None
    lengths_B = torch.tensor([30, 11])
    keep = valid_mask(lengths_B, 30)
    targets = torch.randint(0, 5, (2, 30)).masked_fill(~keep, IGNORE)
    with torch.no_grad():
        module._evaluate({"tokens": random_tokens(2, 30, seed=4), "length": lengths_B, "targets": targets}, "val")
    metrics = module.metrics["val"]
    assert set(metrics) == {"accuracy", "balanced_accuracy", "mcc", "coding_mcc"}
    assert int(metrics["accuracy"].tp.sum() + metrics["accuracy"].fn.sum()) == 41  # the real bases only
    values = TargetSpace(TargetKind.BASE_VALUES, ("signal",), mean=(0.0,), std=(1.0,))
    module = FineTuner(pretrained=str(causal_checkpoint), targets=values.to_dict()).eval()
    module.log = module.log_dict = lambda *a, **k: None
    signal = torch.randn(2, 30).masked_fill(~keep, float("nan"))
    with torch.no_grad():
        module._evaluate({"tokens": random_tokens(2, 30, seed=4), "length": lengths_B, "targets": signal}, "val")
    assert np.isfinite(float(module.metrics["val"]["mse"].compute()))


def test_validation_through_lightning_logs_the_metrics(causal_checkpoint, tables):
    module = FineTuner(pretrained=str(causal_checkpoint))
    data = LabelledDataModule("regress", [str(tables["train_regress"])], val=[str(tables["val_regress"])], batch_size=4)
    [result] = trainer(limit_val_batches=1.0).validate(module, datamodule=data, verbose=False)
    assert module.targets.kind is TargetKind.SEQUENCE_VALUES and module.targets.names == ("x", "y")
    assert {"val/loss", "val/pearson", "val/spearman", "val/mse"} <= set(result)
    assert all(np.isfinite(v) for v in result.values())


def test_checkpoint_round_trip(causal_checkpoint, tmp_path):
    torch.manual_seed(0)
    module = FineTuner(
        pretrained=str(causal_checkpoint),
        lora_rank=2,
        head={"pooling": "attention"},
        targets=TargetSpace(TargetKind.SEQUENCE_VALUES, ("v",), mean=(3.0,), std=(2.0,)).to_dict(),
    )
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "lora_B" in name or "query" in name:
                param.normal_()
    L_trainer = trainer()
    L_trainer.strategy.connect(module)
    L_trainer.save_checkpoint(tmp_path / "tuned.ckpt")
    loaded = FineTunedModel.load(tmp_path / "tuned.ckpt").network
    assert isinstance(loaded, FineTunedNetwork) and not loaded.training and loaded.targets == module.targets
    assert any("lora_A" in name for name, _ in loaded.named_parameters())  # the adapters, as trained
    tokens_BL, lengths_B = random_tokens(2, 20, seed=5), torch.tensor([20, 14])
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.predict_outputs(tokens_BL, lengths_B), module.eval().predict_outputs(tokens_BL, lengths_B)
        )
    with pytest.raises(ValueError, match="language model"):
        FineTunedModel.load(causal_checkpoint)


def test_argument_errors(causal_checkpoint):
    with pytest.raises(ValueError, match="freeze_backbone and lora_rank"):
        FineTuner(pretrained=str(causal_checkpoint), freeze_backbone=True, lora_rank=2)
    with pytest.raises(ValueError, match="lora_rank"):
        FineTuner(pretrained=str(causal_checkpoint), lora_rank=-1)
    with pytest.raises(ValueError, match="--pretrained"):
        FineTuner()
    module = FineTuner(pretrained=str(causal_checkpoint), targets=CLASSES.to_dict())
    module.set_targets(TargetSpace.from_dict(CLASSES.to_dict()))  # the same again: fine
    with pytest.raises(ValueError, match="fine-tune a new model"):
        module.set_targets(TargetSpace(TargetKind.SEQUENCE_CLASSES, ("a", "b", "c")))
    scratch = FineTuner(pretrained=str(causal_checkpoint), from_scratch=True, targets=CLASSES.to_dict())
    loaded = FineTuner(pretrained=str(causal_checkpoint), targets=CLASSES.to_dict())
    assert not torch.equal(scratch.model.embed.weight, loaded.model.embed.weight)


def test_setup_refuses_a_window_beyond_the_context(causal_checkpoint, tmp_path):
    module = FineTuner(pretrained=str(causal_checkpoint))

    class Data:
        target_space = TargetSpace(TargetKind.BASE_CLASSES, ANNOTATION_CLASSES, strand_swap=STRAND_SWAP)
        window = 4096

    class Trainer:
        datamodule = Data()

    module._trainer = Trainer()
    with pytest.raises(ValueError, match="lower --window"):
        module.setup("fit")
    bare = FineTuner(pretrained=str(causal_checkpoint))
    bare._trainer = type("T", (), {"datamodule": None})()
    with pytest.raises(ValueError, match="no targets"):
        bare.setup("fit")


def test_validation_summary_says_why_the_run_ended_before_max_steps():
    """Early stopping is named only when it ended the run; a run that ended on another limit
    before max_steps says so, and a run that reached max_steps says neither."""
    from genoformer.genome.finetune import Validation, validation_summary

    validations = [Validation(2, {"val/loss": 0.5}), Validation(4, {"val/loss": 0.7})]

    def summary(stopped_early: bool, max_steps: int = 40) -> str:
        return validation_summary(
            validations,
            best=Path("b.ckpt"),
            last=Path("l.ckpt"),
            max_steps=max_steps,
            patience=3,
            stopped_early=stopped_early,
            predict="use CHECKPOINT",
        )

    assert "stopped early at step 4 of 40" in summary(True)
    assert "stopped early" not in summary(False) and "training ended at step 4 of 40" in summary(False)
    assert "stopped early" not in summary(False, 4) and "training ended" not in summary(False, 4)
    assert "WORSE than the best" in summary(False) and "use b.ckpt" in summary(False)
