"""genoformer: transformers on very long scientific sequences.

Modules (import them directly; this package imports nothing, so that `import genoformer.data`
or `import genoformer.kernels` stays light):
    genoformer.model               TransformerConfig, Transformer (plain nn.Modules)
    genoformer.lightning_module    GenoformerLM (objective, optimiser, metrics), Objective
    genoformer.callbacks           LossPlotCallback, PredictionWriter
    genoformer.loggers             AppendingCSVLogger (resumed runs append to metrics.csv)
    genoformer.embeddings          Embedder, Embeddings, Pooling, save_embeddings, load_embeddings
    genoformer.kernels             attention backends and block-sparse layouts (folder kernels/)
    genoformer.data                stores, datasets and data modules (folder data/)
"""
