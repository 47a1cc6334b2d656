"""The training commands of `genoformer` (fit, validate, test, predict): LightningCLI and its rules;
and `finetune`, which runs `fit` (and `test`) on the shipped fine-tuning recipe.

`genoformer.cli` imports this module only when a training command runs (it imports Lightning,
which takes seconds), so that `genoformer --help` and the tool commands start fast. The rules it
keeps are described in `genoformer.cli`'s docstring and in `GenoformerCLI`'s.

Config files are parsed in jsonargparse's "omegaconf+" mode and may build on fragments
(`include:`, see `compose_config`).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

import torch
import yaml
from jsonargparse import Namespace, get_loader
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from genoformer.core.callbacks import PredictionWriter, default_progress_bar
from genoformer.core.checkpoints import (
    AtomicCheckpointIO,
    best_checkpoint,
    canonical_state_dict,
    check_checkpoint_file,
    read_checkpoint,
    resolve_checkpoint,
)
from genoformer.core.loading import read_model_checkpoint
from genoformer.core.run_lock import RunLock
from genoformer.data.genome.datamodule import GenomeDataModule
from genoformer.data.genome.labelled import LabelledDataModule
from genoformer.data.genome.targets import Task
from genoformer.data.storage import write_text
from genoformer.data.timeseries.datamodule import TimeSeriesDataModule
from genoformer.genome.commands import file_list
from genoformer.genome.finetune import VALIDATION_MONITOR, FineTuner, read_validations, validation_summary
from genoformer.genome.head_pooling import HeadPooling
from genoformer.genome.lm import GenoformerLM
from genoformer.parse_errors import ShortErrors, command_with, options_given
from genoformer.shipped import INCLUDE_KEY, QuotedStrings, compose_config, configs_dir, recipe_path
from genoformer.timeseries.module import TimeSeriesForecaster
from genoformer.training_options import (
    EVALUATION_COMMANDS,
    genoformer_core_options,
    genoformer_options,
    with_recipe_paths,
)

SHIPPED_CLASSES = (
    GenoformerLM,
    TimeSeriesForecaster,
    FineTuner,
    GenomeDataModule,
    TimeSeriesDataModule,
    LabelledDataModule,
)
"""The shipped training modules and data modules: imported here, so that `--model.help
TimeSeriesForecaster` and `--data.help GenomeDataModule` find them by their short names."""


class RunConfigSaver(SaveConfigCallback):
    """Writes config.yaml as LightningCLI does, except that it is written through the atomic
    writer (a reader never sees half of it) and that `fit` writes it after its first training
    batch: a run that fails before then leaves the run directory as it was."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            self._save(trainer)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._save(trainer)

    def _save(self, trainer: Any) -> None:
        if self.already_saved:
            return
        log_dir = trainer.log_dir  # on every rank: it broadcasts
        if trainer.is_global_zero:
            text = self.parser.dump(self.config, skip_none=False)
            write_text(Path(log_dir) / self.config_filename, text, overwrite=True)
        self.already_saved = True


class GenoformerCLI(LightningCLI):
    """LightningCLI that keeps runs apart and evaluates trained weights only.

    - One run directory (`trainer.default_root_dir`) holds one run. `fit` holds its lock for the
      life of the run, so a second `fit` there fails at once naming the first (process, host,
      start; `genoformer.core.run_lock`). `fit` without `--ckpt_path`
      refuses a directory that holds a run (a metrics.csv, or files in a checkpoints folder) and
      says how to resume it or start elsewhere; `--ckpt_path last` (or `best`) resolves to that
      run's checkpoint, so checkpoints, metrics.csv (appended to by AppendingCSVLogger),
      config.yaml and loss.png keep describing one run. A run resumed after it reached
      max_steps trains nothing and says how to train it longer.
    - `fit --ckpt_path` resumes training runs only: a checkpoint of weights alone (no optimizer
      state) is refused with the command that starts a new run from it, `--init_weights`.
    - The model of a checkpoint (`--ckpt_path`, `--init_weights`) is the checkpoint's (for
      `--init_weights`, its nested sections such as `transformer`; the training settings, such as
      the learning rate, are the config's, and a config value the checkpoint overrules is said). Your
      `--model...` options that differ from its hyperparameters are refused for a resumed run
      (it keeps its model), and honoured, each said in one line, when evaluating or starting a
      new run from the weights, as long as the weights still fit; otherwise refused naming both
      values.
    - `validate`, `test` and `predict` need `--ckpt_path` (`last`, `best` or a path) or
      `--untrained`. The shipped configs log straight into the run directory (a CSVLogger with an
      empty name and version), so these commands' logger version becomes the subcommand:
      `<run dir>/test/metrics.csv`, `<run dir>/predict/predictions.npz`, each with its own
      config.yaml; a result that is already there is replaced only with `--overwrite`.
    - A data store named on the command line (`--data.init_args.store`) without the files it is
      built from is used as it is, when it exists (the config's files build a store only where
      there is none).
    - A config that asks for a GPU on a machine without one is refused with its CPU version (when
      configs/ has one) and the overrides that run it on this machine's CPU.
    - A command that fails leaves no folder it created behind (an empty run directory, its
      checkpoints/ folder).

    `command_line` holds the arguments after `genoformer` (the subcommand first): hints repeat
    them as whole commands, and a checkpoint's hyperparameters are applied by parsing them again.
    """

    def __init__(self, *args: Any, command_line: Sequence[str] = (), **kwargs: Any) -> None:
        self.command_line = list(command_line)
        self.ckpt_keyword: Optional[str] = None  # "last" or "best" when --ckpt_path gave one
        self.resumed_step: Optional[int] = None  # the training step of the checkpoint fit resumes
        self.weights: Optional[dict] = None  # the checkpoint whose weights a new run starts from
        self.weights_source: Optional[str] = None
        self.model_overrides: dict[str, tuple[Any, Any]] = {}  # option -> (checkpoint's, yours)
        self.checkpoint_shapes: dict[str, tuple[int, ...]] = {}
        self.nothing_to_train = False
        self.new_folders: list[Path] = []
        self.run_lock: Optional[RunLock] = None
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            _remove_empty_folders(self.new_folders)
            raise

    # ------------------------------------------------------------------- parsers and help
    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        genoformer_options(parser, subcommand)
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        genoformer_core_options(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """As LightningCLI parses, with the shipped recipes named by name (`--config quickstart`)."""
        if isinstance(args, (dict, Namespace)):
            super().parse_arguments(parser, args)
            return
        try:
            typed = with_recipe_paths(self.command_line if args is None else args)
        except FileNotFoundError as error:  # a parse error, as any other option's (exit status 2)
            parser.error(f"--config: {error}")
        self.config = parser.parse_args(typed)

    # ------------------------------------------------------------------- checkpoints and the model
    def _parse_ckpt_path(self) -> None:
        # Runs right after parsing, before anything is built (in place of LightningCLI's own).
        # `last` and `best` become the run's file; a broken file gets our message rather than
        # torch's; the checkpoint's model hyperparameters replace the configured ones.
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        config = self.config[subcommand]
        self.ckpt_keyword = config.ckpt_path if config.ckpt_path in ("last", "best") else None
        if self.ckpt_keyword is not None:
            resolved = self._find_checkpoint(config.trainer, self.ckpt_keyword)
            if resolved is None and subcommand != "fit":
                folders = (
                    ", ".join(str(folder) for folder, _, _ in self._checkpoint_dirs(config.trainer))
                    or "(none configured)"
                )
                raise FileNotFoundError(
                    f"--ckpt_path {self.ckpt_keyword}: the run in {config.trainer.default_root_dir} has no "
                    f"checkpoint (no last.ckpt in {folders}); train it first with `genoformer fit` and the same "
                    "config, or pass --ckpt_path PATH to a .ckpt file"
                )
            if resolved is not None:
                print(f"genoformer {subcommand}: --ckpt_path {self.ckpt_keyword} is {resolved}")
            config.ckpt_path = None if resolved is None else str(resolved)
        if config.ckpt_path is not None and not _lightning_keyword(config.ckpt_path):
            if subcommand != "fit" and self.ckpt_keyword is None:  # a run directory, RUN_DIR/best, a model's name
                config.ckpt_path = str(resolve_checkpoint(config.ckpt_path))
            checkpoint = read_checkpoint(config.ckpt_path)
            if subcommand == "fit":
                if "optimizer_states" not in checkpoint:
                    raise ValueError(self._weights_only_message(config))
                self.resumed_step = int(checkpoint.get("global_step", 0))
            self._take_the_model_of(checkpoint, config.ckpt_path, resume=subcommand == "fit")
        elif subcommand == "fit" and config.init_weights is not None:
            model_class = _class_of(config.model)
            kind = getattr(model_class, "kind", None)
            source = resolve_checkpoint(config.init_weights)
            checkpoint = read_checkpoint(source) if kind is None else read_model_checkpoint(source, kind)[0]
            self.weights, self.weights_source = checkpoint, str(source)
            self._take_the_model_of(checkpoint, source, resume=False, new_run=True)

    def _weights_only_message(self, config: Namespace) -> str:
        """Why `fit --ckpt_path` refuses a checkpoint of weights alone, and the command that
        starts a new run from them."""
        path = config.ckpt_path
        change = ["--init_weights", str(path)]
        if self._run_folders_hold_files(config.trainer):
            change += ["--trainer.default_root_dir", "NEW_DIR"]
        return (
            f"--ckpt_path resumes a training run, and {path} holds a model's weights only (no optimizer "
            "state or training progress to resume: a model written by `genoformer export`, or shipped as one). "
            "To train a new run that starts from these weights (the model is the checkpoint's, with your "
            "--model options where the weights fit):\n"
            f"  {self._command_with(*change, drop=('--ckpt_path',))}"
        )

    def _take_the_model_of(
        self, checkpoint: dict, source: str | os.PathLike, resume: bool, new_run: bool = False
    ) -> None:
        """Parse the command again with the checkpoint's model hyperparameters over the config's
        (given after the user's options, as a command-line override would be, so that what the
        config derives from the model, the data window, follows it); then with the user's own
        `--model...` options over those, and compare.

        A new run from the weights (`new_run`, --init_weights) takes from the checkpoint what the
        model is, its nested sections (`transformer`, `forecast`, ...), and from the config how to
        train it, the module's own settings (learning rate, warm-up, weight decay, ...)."""
        self.checkpoint_shapes = {
            key: tuple(value.shape) for key, value in canonical_state_dict(checkpoint.get("state_dict") or {}).items()
        }
        hparams = dict(checkpoint.get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if new_run:
            hparams = {key: value for key, value in hparams.items() if isinstance(value, dict)}
        if not hparams:
            return
        subcommand = self.config["subcommand"]
        ckpt_path = self.config[subcommand].ckpt_path
        args = [*with_recipe_paths(self.command_line), "--model", json.dumps(hparams)]
        end = ["--ckpt_path", "null" if ckpt_path is None else str(ckpt_path)]
        theirs = self.parser.parse_args(args + end)
        mine = _model_options(self.command_line)
        yours = self.parser.parse_args(args + mine + end) if mine else theirs
        # what the checkpoint says the model is; how to run it (runtime) is the command line's anyway
        described = set(_flat(hparams))
        differences = {
            key: values
            for key, values in _differences(
                _flat(theirs[subcommand].model.init_args), _flat(yours[subcommand].model.init_args)
            ).items()
            if key in described
        }
        if differences and resume:
            listed = "; ".join(
                f"--model.{key} is {theirs_value!r} there, {yours_value!r} in your options"
                for key, (theirs_value, yours_value) in differences.items()
            )
            raise ValueError(
                f"--ckpt_path {source} resumes a run, and a resumed run keeps its model: {listed}. Drop those "
                "options to resume it, or start a new run from its weights with them:\n"
                f"  {self._command_with('--init_weights', str(source), '--trainer.default_root_dir', 'NEW_DIR', drop=('--ckpt_path',))}"
            )
        for key, (theirs_value, yours_value) in differences.items():
            print(
                f"genoformer {subcommand}: --model.{key} {yours_value!r} (your option) replaces the "
                f"{theirs_value!r} of the model in {source}"
            )
        if not resume:
            # what the config file asked for and the checkpoint overrules: said, never silently dropped
            configured = self.parser.parse_args([*with_recipe_paths(self.command_line), *end])
            overruled = {
                key: values
                for key, values in _differences(
                    _flat(theirs[subcommand].model.init_args), _flat(configured[subcommand].model.init_args)
                ).items()
                if key in described and key not in differences and values[1] is not None
            }
            for key, (theirs_value, config_value) in overruled.items():
                print(
                    f"genoformer {subcommand}: the model in {source} has {key} {theirs_value!r}, not the "
                    f"{config_value!r} of your config; add --model.{key} {config_value!r} to use the config's"
                )
        self.model_overrides = {f"--model.{key}": values for key, values in differences.items()}
        self.config = yours

    def _check_weights_fit(self, source: str) -> None:
        """ValueError naming the user's model options when the weights of `source` no longer fit
        the model they build."""
        if not self.model_overrides or not self.checkpoint_shapes:
            return
        own = {key: tuple(value.shape) for key, value in canonical_state_dict(self.model.state_dict()).items()}
        misfits = sorted(
            key for key in set(own) | set(self.checkpoint_shapes) if own.get(key) != self.checkpoint_shapes.get(key)
        )
        if not misfits:
            return
        key = misfits[0]
        options = "; ".join(
            f"{name} {yours!r} (the checkpoint's: {theirs!r})" for name, (theirs, yours) in self.model_overrides.items()
        )
        raise ValueError(
            f"the weights of {source} do not fit the model your options make ({options}): {key} is "
            f"{self.checkpoint_shapes.get(key, 'absent')} in the checkpoint, {own.get(key, 'absent')} here. "
            f"Drop {' and '.join(self.model_overrides)} to use the checkpoint's model"
        )

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """LightningCLI's trainer, saving and loading checkpoints with `AtomicCheckpointIO` (unless
        the config names another checkpoint plugin or the strategy brings its own)."""
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer

    def after_instantiate_classes(self) -> None:
        if self.subcommand in EVALUATION_COMMANDS and self.config_init[self.subcommand].ckpt_path is not None:
            self._check_weights_fit(str(self.config_init[self.subcommand].ckpt_path))
        if self.weights is None:
            return
        self._check_weights_fit(self.weights_source)
        checkpoint = dict(self.weights)
        checkpoint.pop("seed", None)  # a new run draws its own per-step seeds
        self.model.on_load_checkpoint(checkpoint)  # the module's own checks and key names
        self.model.load_state_dict(checkpoint["state_dict"])
        step = checkpoint.get("global_step")
        print(
            f"genoformer fit: a new run, starting from the weights in {self.weights_source}"
            + ("" if step is None else f" (step {step} of the training that wrote them)")
        )
        self.weights = None  # loaded: the file's tensors are the model's now

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """The trainer, with `default_progress_bar` where it shows progress and has no bar of its
        own: plain lines in a log, Lightning's bar (reading "Epoch N", not "Epoch 0/-2") on a terminal."""
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        if config.get("enable_progress_bar") is not False and not any(
            isinstance(callback, ProgressBar) for callback in [*given, *callbacks]
        ):
            callbacks = [*callbacks, default_progress_bar()]
        return super()._instantiate_trainer(config, callbacks)

    # ------------------------------------------------------------------- checks
    def before_instantiate_classes(self) -> None:
        config = self.config if self.subcommand is None else self.config[self.subcommand]
        self._refuse_missing_gpu(config)
        if self.subcommand in EVALUATION_COMMANDS:
            if config.ckpt_path is None and not config.untrained:
                raise ValueError(
                    f"genoformer {self.subcommand} evaluates trained weights; say which:\n"
                    f"  {self._command_with('--ckpt_path', 'last')}\n"
                    "(or --ckpt_path best, or --ckpt_path PATH to a .ckpt file); to evaluate the untrained "
                    f"model on purpose:\n  {self._command_with('--untrained')}"
                )
            if config.ckpt_path is not None and config.untrained:
                raise ValueError("--untrained and --ckpt_path contradict each other; pass one of them")
            logger = config.trainer.logger
            init_args = getattr(logger, "init_args", None)
            if init_args is not None and "version" in init_args and not init_args.version:
                init_args.version = self.subcommand
        self._use_a_named_store(config)
        self.new_folders = _missing_folders(self._run_folders(config.trainer))

    def _use_a_named_store(self, config: Namespace) -> None:
        """A store named on the command line without the files it is built from is used as it is
        (when it exists): the config's files build a store only where there is none."""
        data = config.get("data")
        if not isinstance(data, Namespace) or "init_args" not in data or "class_path" not in data:
            return
        inputs = getattr(_class_of(data), "store_inputs", None)
        store = data.init_args.get("store")
        given = options_given(self.command_line)
        if inputs is None or store is None or not {"--data.init_args.store", "--data.store"} & given:
            return
        if {f"--data.init_args.{inputs}", f"--data.{inputs}"} & given or not data.init_args.get(inputs):
            return
        files = ", ".join(map(str, data.init_args[inputs]))
        command = f"genoformer {self.subcommand or 'fit'}"
        if Path(store).exists():
            print(
                f"{command}: training on the store {store} as it is; the config's {inputs} ({files}) builds a "
                "store only where there is none"
            )
            data.init_args[inputs] = []
        else:
            print(
                f"{command}: {store} does not exist yet: building it from the config's {inputs} ({files}); "
                f"to build it from your own files, name them: --data.init_args.{inputs} '[GENOME.fa]'"
            )

    def _refuse_missing_gpu(self, config: Namespace) -> None:
        trainer = config.trainer
        accelerator = trainer.accelerator
        if not isinstance(accelerator, str) or accelerator not in ("gpu", "cuda") or torch.cuda.is_available():
            return
        lines = [
            f"this configuration asks for a GPU (trainer.accelerator: {accelerator}), but torch "
            f"{torch.__version__} sees no CUDA GPU here."
        ]
        for path in _config_paths(self.command_line):
            twin = _cpu_twin(path)
            if twin is not None:
                args = [
                    str(twin) if arg == path else f"--config={twin}" if arg == f"--config={path}" else arg
                    for arg in self._full_command_line()
                ]
                lines += [f"{twin} is its CPU version (a model sized to train on a CPU):", f"  {command_with(args)}"]
                break
        overrides = ["--trainer.accelerator", "cpu"]
        if str(trainer.precision) not in ("32", "32-true"):
            overrides += ["--trainer.precision", "32-true"]
        if str(trainer.devices) not in ("1", "auto"):
            overrides += ["--trainer.devices", "1"]
        runtime = _init_args(config.get("model")).get("runtime")
        if isinstance(runtime, Namespace) and runtime.get("compile"):
            overrides += ["--model.init_args.runtime.compile", "false"]
        data = _init_args(config.get("data"))
        workers = max(1, (os.cpu_count() or 1) // 4)
        if isinstance(data.get("num_workers"), int) and data.num_workers > workers:
            overrides += ["--data.init_args.num_workers", str(workers)]
        batch = data.get("batch_size")
        if isinstance(batch, int) and batch > 1:
            overrides += ["--data.init_args.batch_size", "1"]
        keep = (
            f"; add --trainer.accumulate_grad_batches {batch} to keep the recipe's {batch} windows per optimizer step"
            if isinstance(batch, int) and batch > 1
            else ""
        )
        lines += [
            "To run this configuration on the CPU anyway (slow: a model sized for a GPU trains many times "
            f"slower on a CPU), in float32, uncompiled, with data workers and batches for this machine's "
            f"{os.cpu_count()} cores{keep}:",
            f"  {self._command_with(*overrides)}",
        ]
        raise ValueError("\n".join(lines))

    def before_fit(self) -> None:
        # One run per directory, from here to the end of fit (rank 0 only: the ranks Lightning
        # starts share their run); then the checks of what the directory holds.
        if rank_zero_only.rank == 0:
            self.run_lock = RunLock(self.trainer.default_root_dir)
            self.run_lock.acquire()
        try:
            self._check_run_directory()
        except BaseException:
            self._release_run_lock()
            raise

    def _release_run_lock(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()
            self.run_lock = None

    def _check_run_directory(self) -> None:
        existing = self._run_files()
        run_dir = self.trainer.default_root_dir
        max_steps = self.trainer.max_steps
        if self.resumed_step is not None and max_steps is not None and 0 <= max_steps <= self.resumed_step:
            self.nothing_to_train = True
            longer = str(max(2 * max_steps, self.resumed_step + 1))
            print(
                f"genoformer fit: the run in {run_dir} already reached trainer.max_steps {max_steps} (its "
                f"checkpoint {self.config_init['fit']['ckpt_path']} is at step {self.resumed_step}): nothing to "
                "train. To train it longer, raise max_steps (the learning-rate schedule stretches to the new end "
                f"unless model.total_steps is set):\n  {self._command_with('--ckpt_path', 'last', '--trainer.max_steps', longer)}"
            )
            return
        if self.config_init["fit"]["ckpt_path"] is not None or not existing:
            if self.ckpt_keyword is not None and not existing:
                print(f"genoformer fit: no run to resume in {run_dir}; starting a new one")
            return
        if self.ckpt_keyword is not None:
            raise FileNotFoundError(
                f"--ckpt_path {self.ckpt_keyword}: {run_dir} holds a run ({existing[0]}) but no checkpoint of it "
                "to resume from; start a new run in another directory (or delete this one first):\n"
                f"  {self._command_with('--trainer.default_root_dir', 'NEW_DIR', drop=('--ckpt_path',))}"
            )
        raise FileExistsError(
            f"{run_dir} already holds a training run ({', '.join(str(path) for path in existing[:3])}). "
            "Resume it (its checkpoints, metrics and plot continue):\n"
            f"  {self._command_with('--ckpt_path', 'last')}\n"
            "or start a new run in another directory (or delete this one first):\n"
            f"  {self._command_with('--trainer.default_root_dir', 'NEW_DIR')}"
        )

    def fit(self, model: LightningModule, **kwargs: Any) -> None:
        """Trainer.fit, unless the resumed run is already at its max_steps (before_fit said so),
        holding the run directory's lock (`genoformer.core.run_lock`) to the end."""
        try:
            if not self.nothing_to_train:
                self.trainer.fit(model, **kwargs)
        finally:
            self._release_run_lock()

    def before_validate(self) -> None:
        self._refuse_to_replace_results("validate")

    def before_test(self) -> None:
        self._refuse_to_replace_results("test")

    def before_predict(self) -> None:
        self._refuse_to_replace_results("predict")

    def _refuse_to_replace_results(self, subcommand: str) -> None:
        results = [path for path in self._result_files(subcommand) if path.exists()]
        if results and not self.config_init[subcommand].overwrite:
            raise FileExistsError(
                f"{', '.join(map(str, results))} already holds the result of an earlier `genoformer "
                f"{subcommand}`; to replace it:\n  {self._command_with('--overwrite')}"
            )
        for path in results:
            if path.name == "metrics.csv":  # the logger appends; a replaced result starts empty
                path.unlink()

    # ------------------------------------------------------------------- the run directory
    @staticmethod
    def _checkpoint_dirs(trainer: Any) -> list[tuple[Path, type[ModelCheckpoint], bool]]:
        """(folder, class, save_last) of every ModelCheckpoint in the parsed trainer config; a
        callback without dirpath saves into `<default_root_dir>/checkpoints`."""
        callbacks = trainer.callbacks or []
        found = []
        for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
            kind = _class_of(callback)
            if isinstance(kind, type) and issubclass(kind, ModelCheckpoint):
                init_args = callback.get("init_args") or {}
                dirpath = init_args.get("dirpath")
                folder = Path(dirpath) if dirpath else Path(trainer.default_root_dir or ".") / "checkpoints"
                found.append((folder, kind, bool(init_args.get("save_last"))))
        return found

    def _run_folders(self, trainer: Any) -> list[Path]:
        """The folders a run writes into: the run directory, its checkpoint folders and its
        logger's folder (Lightning's default one too)."""
        root = Path(trainer.default_root_dir or ".")
        folders = [root, root / "lightning_logs", *(folder for folder, _, _ in self._checkpoint_dirs(trainer))]
        init_args = _init_args(trainer.get("logger"))
        if init_args.get("save_dir") is not None:
            folders.append(
                Path(init_args.save_dir, str(init_args.get("name") or ""), str(init_args.get("version") or ""))
            )
        return folders

    def _run_folders_hold_files(self, trainer: Any) -> bool:
        """Whether the configured run directory holds a run already (files in its checkpoint
        folders, or a metrics.csv), judged from the parsed config before anything is built."""
        folders = [folder for folder, _, _ in self._checkpoint_dirs(trainer)]
        return (Path(trainer.default_root_dir or ".") / "metrics.csv").exists() or any(
            folder.is_dir() and any(folder.iterdir()) for folder in folders
        )

    def _run_files(self) -> list[Path]:
        """What marks the configured directory as holding a run: its metrics.csv and the files in
        its checkpoint folders."""
        found = [Path(self.trainer.log_dir or self.trainer.default_root_dir) / "metrics.csv"]
        for folder, _, _ in self._checkpoint_dirs(self.config[self.subcommand].trainer):
            if folder.is_dir():
                found += sorted(folder.iterdir())
        return [path for path in dict.fromkeys(found) if path.exists()]

    def _find_checkpoint(self, trainer: Any, which: str) -> Optional[Path]:
        """The run's newest `last.ckpt` (which="last"), or the best checkpoint recorded in it
        (which="best"); None when the run has no last.ckpt."""
        lasts = {
            folder / f"{kind.CHECKPOINT_NAME_LAST}{kind.FILE_EXTENSION}"
            for folder, kind, save_last in self._checkpoint_dirs(trainer)
            if save_last
        }
        lasts = sorted((path for path in lasts if path.is_file()), key=lambda path: path.stat().st_mtime)
        if not lasts:
            return None
        if which == "last":
            return check_checkpoint_file(lasts[-1])
        best = best_checkpoint(lasts[-1].parent)
        if best is None:
            raise FileNotFoundError(
                f"--ckpt_path best: the run in {trainer.default_root_dir} recorded no best checkpoint "
                "(its ModelCheckpoint has no monitor, or saved none yet); pass --ckpt_path last or --ckpt_path PATH"
            )
        return check_checkpoint_file(best[0])

    def _result_files(self, subcommand: str) -> list[Path]:
        """Files an evaluation command writes that hold its result."""
        paths = []
        if isinstance(self.trainer.logger, CSVLogger) and subcommand != "predict":
            paths.append(Path(self.trainer.log_dir) / "metrics.csv")
        if subcommand == "predict":
            paths += [c.output_path(self.trainer) for c in self.trainer.callbacks if isinstance(c, PredictionWriter)]
        return paths

    def _full_command_line(self) -> list[str]:
        """`command_line` with its subcommand (run=False parses none: it builds as `fit` does)."""
        return (["fit"] if self.config.get("subcommand") is None else []) + self.command_line

    def _command_with(self, *extra: str, drop: Sequence[str] = ()) -> str:
        """The command being run with the options in `extra` set (replacing those it gives)
        and the options in `drop` left out."""
        return command_with(self._full_command_line(), *extra, drop=drop)


def _lightning_keyword(ckpt_path: str) -> bool:
    """Lightning's other --ckpt_path keywords (hpc, registry[:...]), passed through as they are."""
    return str(ckpt_path) == "hpc" or str(ckpt_path).startswith("registry")


def _class_of(config: Any) -> Any:
    """The class a parsed `class_path` config names."""
    module, _, name = config.class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _init_args(config: Any) -> Namespace:
    """The init_args of a parsed class config; empty for anything else (None, a bool)."""
    init_args = config.get("init_args") if isinstance(config, Namespace) else None
    return init_args if isinstance(init_args, Namespace) else Namespace()


def _model_options(args: Sequence[str]) -> list[str]:
    """The `--model.OPTION` options of a command line, with their values, in order."""
    found: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("--model."):
            found.append(arg)
            if "=" not in arg and index + 1 < len(args):
                found.append(args[index + 1])
    return found


def _flat(namespace: Any, prefix: str = "") -> dict[str, Any]:
    """A parsed config as {dotted key: value}; lists are values."""
    values = namespace.as_dict() if isinstance(namespace, Namespace) else namespace
    if not isinstance(values, dict):
        return {prefix.rstrip("."): values}
    flat: dict[str, Any] = {}
    for key, value in values.items():
        flat.update(
            _flat(value, f"{prefix}{key}.") if isinstance(value, (dict, Namespace)) else {f"{prefix}{key}": value}
        )
    return flat


def _differences(theirs: dict[str, Any], yours: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (theirs, yours)} where the two flat configs differ."""
    return {
        key: (theirs.get(key), yours.get(key))
        for key in dict.fromkeys([*theirs, *yours])
        if theirs.get(key) != yours.get(key)
    }


def _config_paths(args: Sequence[str]) -> list[str]:
    """The config files a command line names (--config PATH, --config=PATH, -c PATH)."""
    paths = []
    for index, arg in enumerate(args):
        if arg in ("--config", "-c") and index + 1 < len(args):
            paths.append(args[index + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def _cpu_twin(config: str) -> Optional[str]:
    """The CPU version of a GPU recipe, as the user would type it (`genome_8k_cpu` for
    `genome_8k_gpu`, configs/X_cpu.yaml for configs/X_gpu.yaml); None where there is none."""
    path = Path(config)
    stem = path.name[: -len(".yaml")] if path.name.endswith(".yaml") else path.name
    if not stem.endswith("_gpu"):
        return None
    twin = str(path.with_name(path.name.replace("_gpu", "_cpu")))
    try:
        recipe_path(twin)
    except FileNotFoundError:
        return None
    return twin


def _missing_folders(folders: Sequence[Path]) -> list[Path]:
    """For each folder that does not exist yet, the outermost of its parents that does not
    either: what creating it would create."""
    missing = []
    for folder in folders:
        folder = Path(os.path.abspath(folder))
        outermost = None
        while not folder.exists() and folder != folder.parent:
            outermost, folder = folder, folder.parent
        if outermost is not None and outermost not in missing:
            missing.append(outermost)
    return missing


def _remove_empty_folders(created: Sequence[Path]) -> None:
    """Remove the folders in `created` (which this command created) and the folders inside them,
    as far as they hold no file."""
    for top in created:
        if not top.is_dir():
            continue
        for folder, _, _ in sorted(os.walk(top), key=lambda entry: -len(Path(entry[0]).parts)):
            if not any(Path(folder).iterdir()):
                Path(folder).rmdir()


# ----------------------------------------------------------------------- composed config files
def _includes_fragments(path: Any) -> bool:
    """Whether `path` is a YAML file with a top-level `include:`."""
    try:
        content = get_loader("yaml")(Path(path).read_text()) if os.path.isfile(path) else None
    except yaml.YAMLError:
        return False  # jsonargparse reports it
    return isinstance(content, dict) and INCLUDE_KEY in content


class ComposingArgumentParser(ShortErrors, LightningArgumentParser):
    """LightningCLI's parser, reading a config file that has `include:` as its composed config
    (other files as jsonargparse reads them), with short parse errors (`genoformer.parse_errors.ShortErrors`).
    Values in a composed config that jsonargparse reads as paths are relative to the working
    directory, as the shipped configs' paths are."""

    def parse_path(
        self,
        path: Any,
        ext_vars: Optional[dict] = None,
        env: Optional[bool] = None,
        defaults: bool = True,
        **kwargs: Any,
    ) -> Any:
        self._refuse_unknown_sections(path)
        if not _includes_fragments(path):
            return super().parse_path(path, ext_vars=ext_vars, env=env, defaults=defaults, **kwargs)
        composed = yaml.dump(compose_config(path), Dumper=QuotedStrings, sort_keys=False)
        return self.parse_string(
            composed, path=os.path.basename(path), ext_vars=ext_vars, env=env, defaults=defaults, **kwargs
        )

    def _refuse_unknown_sections(self, path: Any) -> None:
        """A mistyped top-level key of a config file (`trainr:`) is named first, before whatever
        the sections it leaves out break (an interpolation that finds nothing)."""
        content = compose_config(path) if os.path.isfile(path) else None
        if not isinstance(content, dict):
            return
        known = {name[2:].partition(".")[0] for name in self._option_string_actions if name.startswith("--")}
        subcommands = self._subcommands_action
        known |= set(subcommands.choices) if subcommands is not None else set()
        for key in content:
            if key not in known:
                self.error(f"Option '{key}' is not accepted")


def training_cli(args: Optional[Sequence[str]] = None, run: bool = True) -> LightningCLI:
    """LightningCLI for GenoformerLM or another LightningModule named by model.class_path (such as
    TimeSeriesForecaster); the data module is chosen in the config by class_path.

    `args` None reads the command line (sys.argv), as a console command does. With run=False
    the args take no subcommand: the model, data module and trainer are only instantiated.
    """
    argv = list(sys.argv[1:] if args is None else args)
    return GenoformerCLI(
        LightningModule,
        LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        parser_kwargs={"parser_mode": "omegaconf+", "allow_abbrev": False, "prog": "genoformer"},
        parser_class=ComposingArgumentParser,
        save_config_callback=RunConfigSaver,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        args=None if args is None else list(args),
        run=run,
        command_line=argv,
    )


# ------------------------------------------------------------------------------- finetune
HeadPoolingName = Literal[tuple(member.value.lower() for member in HeadPooling)]
FINETUNE_CONFIGS = {"cpu": "finetune_cpu.yaml", "gpu": "finetune_gpu.yaml"}
"""The shipped recipe `finetune` starts from, per device (configs/)."""


def finetune(
    *,
    pretrained: Path,
    task: Task,
    train: Union[str, list[str]],
    out: Path,
    val: Optional[Union[str, list[str]]] = None,
    test: Optional[Union[str, list[str]]] = None,
    genome: Optional[str] = None,
    max_steps: int = 300,
    batch_size: Optional[int] = None,
    learning_rate: float = 1e-4,
    head_learning_rate: Optional[float] = None,
    lora: int = 0,
    freeze_backbone: bool = False,
    from_scratch: bool = False,
    pooling: HeadPoolingName = "mean",
    window: Optional[int] = None,
    val_every: Optional[int] = None,
    patience: int = 3,
    leaks: Literal["error", "drop"] = "error",
    device: Literal["auto", "cpu", "gpu"] = "auto",
    ckpt_path: Optional[str] = None,
    seed: int = 0,
) -> Path:
    """Fine-tune a pretrained DNA model on labels (per sequence, or gene classes per base).

    A class, labels or values per sequence, or gene classes per base. Writes a run directory as `genoformer fit` does
    (checkpoints/, metrics.csv, loss.png, config.yaml; resumable) and prints the equivalent
    `genoformer fit` command: every flag here is a key of configs/finetune_cpu.yaml. At the end it
    prints the validation scores of the best checkpoint (checkpoints/best.ckpt) and of the last
    (checkpoints/last.ckpt), says when the last is worse, and the command that predicts with the best.

    Args:
        pretrained: A DNA language model: the shipped genoformer-dna, a .ckpt file (`genoformer fit`
            or `export`), a run directory (its best checkpoint), RUN_DIR/best or RUN_DIR/last.
        task: classify (one class per sequence, or several 0/1 label_<name> columns), regress
            (numbers per sequence; or per base from a bedGraph with --genome) or annotate (gene
            classes per base from GenBank/GFF3 annotations).
        train: Training files: TSV/CSV with `sequence` and `label` (or label_<name>) columns; FASTA
            with a TSV of `name` and labels; BED intervals (with --genome); GenBank/GFF3 genomes.
        out: The run directory.
        val: Validation files; default: a tenth of the training data held out without leaks.
        test: Test files: evaluated with the best checkpoint after training, into OUT/test/metrics.csv.
        genome: The FASTA/GenBank file or store that BED/bedGraph intervals (and GFF3 files
            without sequences) refer to.
        max_steps: Optimizer steps.
        batch_size: Sequences (or windows) per step; default the recipe's.
        learning_rate: Peak learning rate of the trunk (or its adapters).
        head_learning_rate: Peak learning rate of the head; default 10 x learning_rate.
        lora: Rank of LoRA adapters (peft) on every projection; 0: no adapters.
        freeze_backbone: A flag: train the head only (a linear probe).
        from_scratch: A flag: the pretrained architecture with random weights (a baseline).
        pooling: Sequence heads: mean, last or attention.
        window: Bases per window of a per-base task (annotate); default the recipe's.
        val_every: Validate every this many steps; default min(100, max_steps). The last step is
            always validated.
        patience: Early stopping: stop after this many validations in a row without a lower
            validation loss; 0: train all max_steps. The checkpoint with the lowest validation
            loss is kept as OUT/checkpoints/best.ckpt beside last.ckpt (the last step's).
        leaks: Training sequences that also occur (either strand) in --val or --test: error, or
            drop them from training.
        device: auto (a GPU when there is one), cpu or gpu.
        ckpt_path: Resume the run in OUT: last, or a .ckpt path (as for fit).
        seed: Seed of the split and of training.
    """
    if device == "gpu" and not torch.cuda.is_available():
        given = {name: value for name, value in locals().items() if name in _FINETUNE_DEFAULTS}
        raise ValueError(
            f"--device gpu: torch {torch.__version__} sees no CUDA GPU here; fine-tune on the CPU "
            f"(the CPU recipe, configs/{FINETUNE_CONFIGS['cpu']}):\n"
            f"  {_finetune_command({**given, 'device': 'cpu'})}"
        )
    on_gpu = device == "gpu" or (device == "auto" and torch.cuda.is_available())
    config = configs_dir() / FINETUNE_CONFIGS["gpu" if on_gpu else "cpu"]
    val_every = min(100, max_steps) if val_every is None else val_every
    overrides = [
        "--trainer.default_root_dir",
        str(out),
        "--trainer.max_steps",
        str(max_steps),
        "--trainer.val_check_interval",
        str(val_every),
        "--seed_everything",
        str(seed),
        "--model.init_args.pretrained",
        str(pretrained),
        "--model.init_args.learning_rate",
        str(learning_rate),
        "--model.init_args.lora_rank",
        str(lora),
        "--model.init_args.freeze_backbone",
        str(freeze_backbone).lower(),
        "--model.init_args.from_scratch",
        str(from_scratch).lower(),
        "--model.init_args.head.pooling",
        HeadPooling(pooling).name,
        "--model.init_args.patience",
        str(patience),
        "--data.init_args.task",
        task,
        "--data.init_args.train",
        json.dumps(file_list(train)),
        "--data.init_args.seed",
        str(seed),
        "--data.init_args.leaks",
        leaks,
    ]
    optional = {
        "--model.init_args.head_learning_rate": head_learning_rate,
        "--data.init_args.val": None if val is None else json.dumps(file_list(val)),
        "--data.init_args.test": None if test is None else json.dumps(file_list(test)),
        "--data.init_args.genome": genome,
        "--data.init_args.batch_size": batch_size,
        "--data.init_args.window": window,
    }
    for flag, value in optional.items():
        if value is not None:
            overrides += [flag, str(value)]
    fit = ["fit", "--config", str(config), *overrides]
    print("genoformer finetune runs:\n  " + shlex.join(["genoformer", *fit, *_resume(ckpt_path)]))
    with warnings.catch_warnings():  # LightningCLI warns that it gets args while sys.argv holds finetune's
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = training_cli([*fit, *_resume(ckpt_path)])
        print(_summary(cli.trainer, Path(out), task, patience))
        if test is not None:  # the checkpoint with the best validation loss
            training_cli(["test", "--config", str(config), *overrides, "--ckpt_path", "best", "--overwrite"])
    if test is not None:
        print(f"test metrics: {Path(out) / 'test' / 'metrics.csv'}")
    return Path(out)


def _summary(trainer: Any, run_dir: Path, task: str, patience: int) -> str:
    """`validation_summary` of the run `trainer` has just trained into `run_dir`."""
    monitored = [c for c in trainer.checkpoint_callbacks if getattr(c, "monitor", None) == VALIDATION_MONITOR]
    lasts = [c for c in trainer.checkpoint_callbacks if getattr(c, "save_last", False)]
    if not monitored or not lasts or not monitored[0].best_model_path:
        return f"no checkpoint keeps the best {VALIDATION_MONITOR} in this configuration; see {run_dir}/checkpoints"
    metrics = run_dir / "metrics.csv"
    predict = (
        "genoformer annotate --checkpoint CHECKPOINT --inputs GENOME.fa --out genes.gff3"
        if task == "annotate"
        else "genoformer classify --checkpoint CHECKPOINT --inputs SEQUENCES.tsv --out predictions.tsv"
    )
    stopped_early = any(c.patience and c.wait_count >= c.patience for c in trainer.early_stopping_callbacks)
    return validation_summary(
        read_validations(metrics) if metrics.is_file() else [],
        best=Path(monitored[0].best_model_path),
        last=Path(lasts[0].last_model_path),
        max_steps=trainer.max_steps,
        patience=patience,
        stopped_early=stopped_early,
        predict=predict,
    )


def _finetune_command(values: dict[str, Any]) -> str:
    """`genoformer finetune` with the options in `values` that differ from their defaults."""
    words = ["genoformer", "finetune"]
    for name, value in values.items():
        if value == _FINETUNE_DEFAULTS[name]:
            continue
        if isinstance(value, bool):
            words.append(f"--{name}")
        elif isinstance(value, (list, tuple)):
            words += [f"--{name}", *map(str, value)]
        else:
            words += [f"--{name}", str(value)]
    return shlex.join(words)


_FINETUNE_DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(finetune).parameters.items()}
"""`finetune`'s options and their defaults (inspect.Parameter.empty for the required ones)."""


def _resume(ckpt_path: Optional[str]) -> list[str]:
    return [] if ckpt_path is None else ["--ckpt_path", ckpt_path]
