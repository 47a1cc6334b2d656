"""genoformer: transformers on very long scientific sequences.

One house (import the modules directly; this package imports nothing of its own, so that `import
genoformer.data` or `import genoformer.kernels` stays light):

    genoformer.core         what every model shares: the transformer trunk and its config
                            (core.transformer), how it runs (core.runtime), the training base
                            (core.training), checkpoints (core.checkpoints, core.export), the
                            inference policy (core.inference), callbacks and loggers, and
                            `genoformer doctor` (core.doctor)
    genoformer.genome       the DNA wing: the language model (genome.lm), embeddings, scoring,
                            evaluation, variant effects, the Markov baseline and their commands
    genoformer.timeseries   the time-series wing: the forecaster model (timeseries.model), its
                            training module, the Forecaster API, the protocol and baselines
                            (timeseries.protocol), its commands
    genoformer.cli          the `genoformer` command: LightningCLI for training, typed commands
    genoformer.hints        error hints that name options as the caller writes them
    genoformer.shipped      what ships: the recipes (configs/), the example data, the pretrained
                            models' names; `genoformer recipes` and `genoformer examples`
    genoformer.signatures   a function's signature read from its module's source (for the CLI)
    genoformer.kernels      attention backends and block-sparse layouts (folder kernels/)
    genoformer.data         storage, inputs, splits, sampling, tiling, packing; genome and
                            time-series stores, datasets and data modules (folder data/)

Arrows run one way: cli -> genome, timeseries -> core -> kernels; the wings and core read data;
no wing imports the other, and neither kernels nor data imports a model. Importing the package
does one thing: in a source checkout it keeps the checkout's root behind site-packages on sys.path
(`_checkout_behind_site_packages`).
"""

import sys as _sys
from pathlib import Path as _Path


def _checkout_behind_site_packages() -> None:
    """In a source checkout the root holds the folder kernels/ (installed as genoformer.kernels).
    Python puts that root first on sys.path for `python -m ...` or `python cli.py` run there, and
    the folder then shadows Hugging Face's `kernels` package, which transformers (5.25 and newer
    require it) imports as soon as it is installed: `from kernels import CUDAProperties` fails
    inside transformers, and with it Hugging Face export and LoRA fine-tuning. The root stays on
    sys.path (benchmarks/ and cli.py import from it), after everything installed."""
    root = _Path(__file__).resolve().parent.parent
    if not ((root / "pyproject.toml").is_file() and (root / "kernels" / "__init__.py").is_file()):
        return  # an installed copy: its parent is site-packages
    at_root = [entry for entry in _sys.path if _Path(entry or ".").resolve() == root]
    if at_root:
        _sys.path[:] = [entry for entry in _sys.path if entry not in at_root] + [str(root)]


_checkout_behind_site_packages()
