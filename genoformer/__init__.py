"""genoformer: transformers on very long scientific sequences.

Modules (import them directly; this package imports nothing, so that `import genoformer.data`
or `import genoformer.kernels` stays light):
    genoformer.model               TransformerConfig, Transformer (plain nn.Modules)
    genoformer.lightning_module    GenoformerLM (objective, optimiser, metrics), Objective
    genoformer.callbacks           LossPlotCallback, PredictionWriter
    genoformer.loggers             AppendingCSVLogger (resumed runs append to metrics.csv)
    genoformer.embeddings          Embedder, Embeddings, Pooling, save_embeddings, load_embeddings
    genoformer.timeseries_model    ForecastConfig, TimeSeriesTransformer (time series on the same trunk)
    genoformer.timeseries_module   TimeSeriesForecaster (MSE + pinball, optimiser, metrics)
    genoformer.forecasting         Forecaster (forecast, embed), ForecastResult
    genoformer.forecast_eval       the long-horizon protocol, SeasonalNaive and DirectAR baselines
    genoformer.timeseries_commands `genoformer forecast` and `genoformer evaluate_forecast`
    genoformer.kernels             attention backends and block-sparse layouts (folder kernels/)
    genoformer.data                stores, datasets and data modules (folder data/)
"""
