"""A CSV logger for runs that resume: metrics.csv grows, it is never emptied.

Lightning's CSVLogger deletes an existing metrics.csv as soon as it starts, so resuming a run
(`genoformer fit ... --ckpt_path last`) lost the metrics of the steps before the checkpoint, and
a run that failed before its first step left the directory without them. `AppendingCSVLogger`
appends to the file instead, and writes nothing (neither metrics.csv nor hparams.yaml) until the
run has logged its first metric. When a new column appears (the first validation metric), the
file is rewritten with it through the atomic writer, so that a crash during the rewrite keeps the
rows already logged; hparams.yaml is written the same way.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from genoformer.data.storage import atomic_build, atomic_open


class _AppendingWriter(ExperimentWriter):
    """Appends rows to an existing metrics.csv (keeping its columns) and defers hparams.yaml."""

    def _check_log_dir_exists(self) -> None:
        # Called by the base __init__ in place of Lightning's check, which deletes metrics.csv.
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.hparams.update(params)

    def save(self) -> None:
        if self.metrics and self.hparams:
            with atomic_build(Path(self.log_dir, self.NAME_HPARAMS_FILE), overwrite=True) as tmp:
                save_hparams_to_yaml(tmp, self.hparams)
        super().save()

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as file:
            rows = list(csv.DictReader(file))
        with atomic_open(Path(self.metrics_file_path), "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)


class AppendingCSVLogger(CSVLogger):
    """Lightning's CSVLogger (same arguments, same files), except that an existing metrics.csv in
    the log directory is appended to instead of deleted, and nothing is written before the first
    metric is logged."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
