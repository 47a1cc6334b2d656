"""Genoformer time-series forecasters for Hugging Face transformers (`trust_remote_code=True`).

This file is copied as `modeling_genoformer_forecaster.py` into every directory that
`genoformer export --format hf` writes for a forecaster (genoformer.core.hf). Unlike the DNA
models' modeling file it runs genoformer's own network (genoformer.timeseries.model), so whoever
loads it needs genoformer installed (`pip install genoformer`): the forecaster's patching,
instance normalisation, forecast tokens, every-token head and linear path are one implementation.

    model = AutoModel.from_pretrained("my-forecaster", trust_remote_code=True).eval()
    out = model(past_values)       # past_values (B, C, L) -> out.point (B, C, H), out.quantiles

Shape legend: B batch, C channels, L context samples, H horizon samples, K quantile levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerConfig
from genoformer.timeseries.model import ForecastConfig, TimeSeriesTransformer


class GenoformerForecasterConfig(PretrainedConfig):
    """A forecaster's architecture: `transformer` (TransformerConfig.to_dict()) and `forecast`
    (ForecastConfig.to_dict()); `genoformer` holds the kind tag and the training hyperparameters."""

    model_type = "genoformer_forecaster"

    def __init__(
        self,
        transformer: Optional[dict[str, Any]] = None,
        forecast: Optional[dict[str, Any]] = None,
        genoformer: Optional[dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        self.transformer = dict(transformer or {})
        self.forecast = dict(forecast or {})
        self.genoformer = genoformer
        super().__init__(**kwargs)


@dataclass
class ForecastOutput(ModelOutput):
    """point (B, C, H) and quantiles (B, C, H, K) or None, float32 in the input's units; loss: the
    MSE of the point forecast when `future_values` (B, C, H) were given."""

    loss: Optional[torch.Tensor] = None
    point: Optional[torch.Tensor] = None
    quantiles: Optional[torch.Tensor] = None


class GenoformerForecaster(PreTrainedModel):
    """genoformer's TimeSeriesTransformer as a transformers model (its weights under `model.`)."""

    config_class = GenoformerForecasterConfig
    base_model_prefix = "model"

    def __init__(self, config: GenoformerForecasterConfig) -> None:
        super().__init__(config)
        self.model = TimeSeriesTransformer(
            TransformerConfig.from_dict(config.transformer),
            ForecastConfig.from_dict(config.forecast),
            RuntimeSettings.for_inference(),
        )
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """The network initialises itself; transformers' default initialisation is not applied."""

    def forward(
        self,
        past_values: torch.Tensor,
        future_values: Optional[torch.Tensor] = None,
        return_dict: Optional[bool] = None,
        **kwargs: Any,
    ):
        point_BCH, quantiles_BCHK = self.model(past_values.float())
        loss = None
        if future_values is not None:
            loss = torch.nn.functional.mse_loss(point_BCH[..., : future_values.shape[-1]], future_values.float())
        return_dict = self.config.return_dict if return_dict is None else return_dict
        if not return_dict:
            return tuple(value for value in (loss, point_BCH, quantiles_BCHK) if value is not None)
        return ForecastOutput(loss=loss, point=point_BCH, quantiles=quantiles_BCHK)
