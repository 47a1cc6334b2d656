"""genoformer: transformers on very long scientific sequences.

One house (import the modules directly; this package imports nothing of its own, so that `import
genoformer.data` or `import genoformer.kernels` stays light):

    genoformer.core         what every model shares: the transformer trunk and its config
                            (core.transformer), how it runs (core.runtime), the training base
                            (core.training), checkpoints (core.checkpoints, core.export), the
                            inference policy (core.inference), callbacks and loggers
    genoformer.genome       the DNA wing: the language model (genome.lm), embeddings, scoring,
                            evaluation, variant effects, the Markov baseline and their commands
    genoformer.timeseries   the time-series wing: the forecaster model (timeseries.model), its
                            training module, the Forecaster API, the protocol and baselines
                            (timeseries.protocol), its commands
    genoformer.cli          the `genoformer` command: its table of commands and their options
    genoformer.training_cli the training commands (fit, validate, test, predict, finetune): LightningCLI
    genoformer.doctor       `genoformer doctor`: what this machine runs, for every shipped recipe
    genoformer.parse_errors one-line parse errors: the nearest option, the forms a value takes
    genoformer.hints        error hints that name options as the caller writes them
    genoformer.shipped      what ships: the recipes (configs/), the example data, the pretrained
                            models' names; `genoformer recipes` and `genoformer examples`
    genoformer.signatures   a function's signature read from its module's source (for the CLI)
    genoformer.kernels      attention backends and block-sparse layouts (folder kernels/)
    genoformer.data         storage, inputs, splits, sampling, tiling, packing; genome and
                            time-series stores, datasets and data modules (folder data/)

Arrows run one way: cli (with training_cli and doctor) -> genome, timeseries -> core -> kernels,
data -> hints, progress, shipped, signatures, parse_errors; no wing imports the other, kernels and
data import neither each other nor a model, and no module imports one that imports it back. The
`[tool.importlinter]` contracts of pyproject.toml say so, and tests/test_import_contract.py checks them.
"""

import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path
from types import ModuleType as _ModuleType


def stand_aside(name: str) -> None:
    """Called by kernels/__init__.py and data/__init__.py when `import NAME` (kernels, data) found
    that folder of a source checkout as a top-level package: Python puts the checkout's root first
    on sys.path for a script, a notebook, `python -c` or `python -m` run there, and the folder would
    then shadow the installed package of that name (Hugging Face's `kernels`, which transformers
    imports, for one). The installed package takes the folder's place in sys.modules, so that the
    import gives it. When none is installed, an empty stand-in takes it: every name read from it
    raises ModuleNotFoundError naming the folder's real import name, and it has no __file__ nor
    __version__, which is how transformers' availability checks (find the spec, then import it)
    tell a folder on sys.path from an installed package. The folders themselves import as
    genoformer.kernels and genoformer.data."""
    root = _Path(__file__).resolve().parent.parent
    elsewhere = [entry for entry in _sys.path if _Path(entry or ".").resolve() != root]
    saved, _sys.path[:] = _sys.path[:], elsewhere
    try:
        spec = next(
            filter(None, (finder.find_spec(name, None) for finder in _sys.meta_path if hasattr(finder, "find_spec"))),
            None,
        )
    finally:
        _sys.path[:] = saved
    if spec is None or spec.loader is None:
        _sys.modules[name] = _NotInstalled(name, root / name)
        return
    module = _util.module_from_spec(spec)
    _sys.modules[name] = module  # the import statement returns what sys.modules holds once the folder's code ran
    spec.loader.exec_module(module)


class _NotInstalled(_ModuleType):
    """What `import kernels` (or data) gives in a checkout's root when no package of that name is
    installed: a module without a file whose every public name raises ModuleNotFoundError."""

    def __init__(self, name: str, folder: _Path) -> None:
        super().__init__(name)
        self._folder = folder

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # __file__, __version__, __path__: read by import machinery and version checks
            raise AttributeError(attr)
        name = self.__name__
        raise ModuleNotFoundError(
            f"No module named {name!r}: import genoformer.{name} for genoformer's folder {name}/, or install the "
            f"package named {name} that you meant; none is installed, and the folder {self._folder} (which a script "
            f"run in the checkout's root finds first) imports only as genoformer.{name}",
            name=name,
        )
