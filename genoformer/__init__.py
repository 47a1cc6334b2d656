"""genoformer: transformers on very long scientific sequences.

One house (import the modules directly; this package imports nothing, so that `import
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
    genoformer.cli          the `genoformer` command: LightningCLI for training, typed commands
    genoformer.hints        error hints that name options as the caller writes them
    genoformer.kernels      attention backends and block-sparse layouts (folder kernels/)
    genoformer.data         storage, inputs, splits, sampling, tiling, packing; genome and
                            time-series stores, datasets and data modules (folder data/)

Arrows run one way: cli -> genome, timeseries -> core -> kernels; the wings and core read data;
no wing imports the other, and neither kernels nor data imports a model.
"""
