"""Two-process DDP fit on the CPU (gloo), run by test_ddp.py: `python ddp_fit_script.py OUT_DIR`.

Builds the run exactly as `genoformer fit --config configs/quickstart.yaml` would (shrunk, with
`--trainer.strategy ddp --trainer.devices 2`). Lightning starts the second rank by running this
same command again; when fit returns, every rank writes its weights to OUT_DIR/rank<R>.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from genoformer.training_cli import training_cli

REPO_ROOT = Path(__file__).resolve().parents[2]


def main(out: Path) -> None:
    cli = training_cli(
        [
            "--config",
            str(REPO_ROOT / "configs" / "quickstart.yaml"),
            "--trainer.strategy",
            "ddp",
            "--trainer.devices",
            "2",
            "--trainer.accelerator",
            "cpu",
            "--trainer.max_steps",
            "3",
            "--trainer.limit_val_batches",
            "0",
            "--trainer.logger",
            "false",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.callbacks",
            "[]",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(out),
            "--model.transformer.d_model",
            "32",
            "--model.transformer.max_seq_len",
            "512",
            "--data.init_args.store",
            str(out / "ecoli.zarr"),
            "--data.init_args.batch_size",
            "2",
            "--data.init_args.num_workers",
            "0",
        ],
        run=False,
    )
    initial = {name: p.detach().clone() for name, p in cli.model.state_dict().items()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    rank = cli.trainer.global_rank
    torch.save(
        {
            "initial": initial,
            "final": cli.model.state_dict(),
            "world_size": cli.trainer.world_size,
            "global_step": cli.trainer.global_step,
        },
        out / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
