"""Forecasts and embeddings from a trained time-series checkpoint.

    forecaster = Forecaster.from_checkpoint("runs/ecg/checkpoints/last.ckpt")
    result = forecaster.forecast(ecg_values, horizon=720)        # result.point, result.quantiles
    point, quantiles = forecaster.forecast_batch(windows_BCL)    # tensors that stay on the device
    vectors = forecaster.embed(ecg_values, pooling="mean")        # (C', E) per series
    ensemble = Forecaster.from_checkpoints(["seed0/best.ckpt", "seed1/best.ckpt"])  # mean forecast

An ensemble (several checkpoints of one configuration, e.g. trained with different seeds)
forecasts the mean of its members' point forecasts and of their quantiles; its members must agree
on context, horizon, channels, patch length and quantile levels. Embeddings come from one network,
so `embed` needs a Forecaster of one checkpoint.

Inputs are numpy arrays or torch tensors (outputs match): one series as (L,) (univariate) or
(C, L); a batch of equally long series as (N, C, L); or a list of series of any lengths. A series
longer than the model's context uses its last `context` samples for forecasting; embeddings tile
long series (windows of the context, each patch taken from the window where it sits farthest from
an edge). Values are in the series' own units: instance normalisation inside the model undoes
itself. NaN marks a missing value, which the model reads as unobserved.

Shape legend: N series, C channels, L samples, H horizon, K quantile levels, T patches,
E model width, C' = C for channel-independent models, else 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from genoformer.core.checkpoints import ModelKind
from genoformer.core.inference import InferenceModel, Pooling, autocast, pool_tokens
from genoformer.core.loading import LoadedModel
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerConfig
from genoformer.data.tiling import Keep, same_length_batches, tile_windows
from genoformer.kernels.dispatch import Backend
from genoformer.timeseries.model import ForecastConfig, TimeSeriesTransformer

SeriesInput = Union[np.ndarray, torch.Tensor, Sequence[Union[np.ndarray, torch.Tensor]]]


@dataclasses.dataclass(frozen=True)
class ForecastResult:
    """Forecasts in the input's type and layout: (H,) for a 1-D input, (C, H) for one (C, L)
    series, (N, C, H) for a batch or a list (a list of (C_i, H) for a list of series with
    different channel counts)."""

    point: Union[np.ndarray, torch.Tensor]
    """The point forecast (trained with MSE)."""
    quantiles: Optional[Union[np.ndarray, torch.Tensor]]
    """The quantile forecasts, the point's shape plus a last axis K; None when the model has none."""
    levels: list[float]
    """The quantile levels (K)."""


ENSEMBLE_FIELDS = ("context", "horizon", "n_channels", "patch_len", "quantiles")
"""The `ForecastConfig` fields on which the members of an ensemble must agree."""


class Forecaster(InferenceModel):
    """Runs a `TimeSeriesTransformer`, or an ensemble of them, in eval mode (see the module docstring)."""

    kind = ModelKind.FORECASTER

    def __init__(
        self,
        model: Union[TimeSeriesTransformer, Sequence[TimeSeriesTransformer]],
        *,
        device: Optional[Union[str, torch.device]] = None,
        autocast_dtype: Optional[torch.dtype] = None,
    ) -> None:
        """
        Args:
            model: the trained network, or several (an ensemble: forecasts are their mean).
            device: where to run; None: CUDA when available, else CPU.
            autocast_dtype: run under torch.autocast with this dtype; None: bfloat16 on CUDA (as
                training does, and as the Triton kernels need), float32 on the CPU.
        """
        members = [model] if isinstance(model, TimeSeriesTransformer) else list(model)
        if not members:
            raise ValueError("an ensemble needs at least one model; got an empty list.")
        for index, member in enumerate(members):
            if member.forecast_config.linear_order and not bool(member.linear_fitted):
                raise ValueError(
                    f"the linear path (forecast.linear_order) of model {index} was never fitted, so its forecasts "
                    "would be wrong: train it with `genoformer fit` (which fits the path when training starts), or "
                    "call model.set_linear(...) with the summed model.linear_normal_equations(...) of training windows."
                )
            for field in ENSEMBLE_FIELDS:
                mine, first = getattr(member.forecast_config, field), getattr(members[0].forecast_config, field)
                if mine != first:
                    raise ValueError(
                        f"ensemble members must agree on forecast.{field}: model 0 has {first}, model {index} has "
                        f"{mine}; ensemble checkpoints of one configuration (e.g. trained with different seeds)."
                    )
        super().__init__(device, autocast_dtype)
        self.members = [self.on_device(member) for member in members]
        self.config: ForecastConfig = members[0].forecast_config

    @property
    def model(self) -> TimeSeriesTransformer:
        """The network of a Forecaster of one checkpoint (ValueError for an ensemble)."""
        if len(self.members) > 1:
            raise ValueError(
                f"this Forecaster averages {len(self.members)} networks, and embeddings come from one: load a single "
                "checkpoint with Forecaster.from_checkpoint(path) to embed or to reach its network."
            )
        return self.members[0]

    @classmethod
    def build(cls, hparams: dict[str, Any], runtime: RuntimeSettings) -> TimeSeriesTransformer:
        return TimeSeriesTransformer(
            TransformerConfig.from_dict(hparams["transformer"]), ForecastConfig.from_dict(hparams["forecast"]), runtime
        )

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **options: Any) -> Forecaster:
        return cls(loaded.network, **options)

    @classmethod
    def from_checkpoints(
        cls,
        paths: Sequence[Union[str, Path]],
        device: Optional[Union[str, torch.device]] = None,
        backend: Backend = Backend.AUTO,
        autocast_dtype: Optional[torch.dtype] = None,
    ) -> Forecaster:
        """An ensemble of TimeSeriesForecaster checkpoints: forecasts are the mean of theirs."""
        return cls([cls.load(path, backend).network for path in paths], device=device, autocast_dtype=autocast_dtype)

    def _autocast(self) -> torch.autocast:
        return autocast(self.device, self.autocast_dtype)

    # ------------------------------------------------------------------------------- forecast
    @torch.inference_mode()
    def forecast(self, series: SeriesInput, horizon: Optional[int] = None, *, batch_size: int = 64) -> ForecastResult:
        """Forecast the next `horizon` samples (default: the trained horizon) of each series.

        NaN values are missing: the model reads them as unobserved. Raises ValueError for
        infinite values, a horizon beyond the trained one, the wrong number of channels (a joint
        model needs the channels it was trained on; a channel-independent one takes any number)
        and series shorter than one patch.
        """
        cfg = self.config
        horizon = self._horizon(horizon)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        items, layout, like = self._as_series(series)
        tails = [values_CL[:, -cfg.context :] for values_CL in items]
        points = [np.empty(0, np.float32)] * len(tails)
        quants = [np.empty(0, np.float32)] * len(tails)
        order = sorted(range(len(tails)), key=lambda i: tails[i].shape)
        for lo in range(0, len(order), batch_size):
            group = order[lo : lo + batch_size]
            # equal shapes share a forward pass; a batch never mixes lengths (no padding)
            by_shape: dict[tuple[int, ...], list[int]] = {}
            for i in group:
                by_shape.setdefault(tails[i].shape, []).append(i)
            for indices in by_shape.values():
                point_BCH, quant_BCHK = self._forecast_tensor(
                    torch.from_numpy(np.stack([tails[i] for i in indices])), horizon
                )
                point_BCH = point_BCH.cpu().numpy()
                quant_BCHK = None if quant_BCHK is None else quant_BCHK.cpu().numpy()
                for row, i in enumerate(indices):
                    points[i] = point_BCH[row]
                    if quant_BCHK is not None:
                        quants[i] = quant_BCHK[row]
        has_quantiles = bool(cfg.quantiles)
        return ForecastResult(
            point=_restore(points, layout, like),
            quantiles=_restore(quants, layout, like) if has_quantiles else None,
            levels=list(cfg.quantiles),
        )

    @torch.inference_mode()
    def forecast_batch(
        self, context_BCL: torch.Tensor, horizon: Optional[int] = None
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Forecasts of a batch of equally long series (B, C, L) given as a tensor, left on this
        Forecaster's device: (point (B, C, H), quantiles (B, C, H, K) or None), float32.

        The path for many windows at once (the evaluator's): the batch runs in one pass, is copied
        to the device once (not at all when it is there already) and nothing comes back to the
        host; a series longer than the context gives its last `context` samples. NaN values are
        missing. ValueError for infinite values, a horizon beyond the trained one, the wrong
        number of channels and series shorter than one patch (the model's checks).
        """
        horizon = self._horizon(horizon)
        context_BCL = context_BCL[..., -self.config.context :]  # what the model reads
        if torch.isinf(context_BCL).any():
            raise ValueError(
                f"the batch holds {int(torch.isinf(context_BCL).sum())} infinite value(s); mark a value as "
                "missing with NaN (the model masks missing values)."
            )
        return self._forecast_tensor(context_BCL, horizon)

    def _forecast_tensor(self, context_BCL: torch.Tensor, horizon: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """`forecast_batch` of inputs already checked (a valid horizon, no infinite value in the last
        `context` samples)."""
        context_BCL = context_BCL[..., -self.config.context :].to(self.device, torch.float32)
        point_BCH, quant_BCHK = self._mean_forecast(context_BCL)
        return point_BCH[..., :horizon], None if quant_BCHK is None else quant_BCHK[:, :, :horizon]

    def _horizon(self, horizon: Optional[int]) -> int:
        """`horizon`, default the trained one; ValueError beyond it."""
        cfg = self.config
        horizon = cfg.horizon if horizon is None else horizon
        if not 1 <= horizon <= cfg.horizon:
            raise ValueError(
                f"horizon must be in [1, {cfg.horizon}] (the model was trained to forecast {cfg.horizon} "
                f"samples in one pass), got {horizon}; train with a longer forecast.horizon for more."
            )
        return horizon

    def _mean_forecast(self, context_BCL: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The members' mean point (B, C, H) and quantile (B, C, H, K) forecasts, float32."""
        point_sum = quant_sum = None
        for member in self.members:
            with self._autocast():
                point_BCH, quant_BCHK = member(context_BCL)
            point_sum = point_BCH.float() if point_sum is None else point_sum + point_BCH.float()
            if quant_BCHK is not None:
                quant_sum = quant_BCHK.float() if quant_sum is None else quant_sum + quant_BCHK.float()
        n = len(self.members)
        return point_sum / n, None if quant_sum is None else quant_sum / n

    # ---------------------------------------------------------------------------------- embed
    @torch.inference_mode()
    def embed(
        self,
        series: SeriesInput,
        *,
        pooling: Union[Pooling, str] = Pooling.MEAN,
        layer: int = -1,
        window: Optional[int] = None,
        overlap: Optional[int] = None,
        batch_size: int = 16,
    ) -> list[Union[np.ndarray, torch.Tensor]]:
        """Per-series embeddings: pooled (C', E) or per patch (C', T, E) with pooling "none".

        Patches are aligned to the end of each series (the first may be partial). Series longer
        than `window` samples (default: the context) are cut into windows overlapping by
        `overlap` samples (default: window // 4), both whole patches; each patch takes its vector
        from the window where it sits farthest from an edge, and pooling runs over the stitched
        patches, so results do not depend on how a series was tiled.
        """
        cfg = self.config
        pooling = Pooling(pooling)
        window = cfg.context if window is None else window
        if not cfg.patch_len <= window <= cfg.context:
            raise ValueError(f"window must be in [{cfg.patch_len}, context={cfg.context}], got {window}.")
        overlap = window // 4 if overlap is None else overlap
        if not 0 <= overlap < window:
            raise ValueError(f"overlap must be in [0, window={window}), got {overlap}.")
        network = self.model  # one network: an ensemble cannot embed
        network.resolve_layer(layer)
        items, _, like = self._as_series(series)
        window_patches = window // cfg.patch_len
        overlap_patches = overlap // cfg.patch_len
        outputs = []
        for values_CL in items:
            n_patches = math.ceil(values_CL.shape[1] / cfg.patch_len)
            padded = n_patches * cfg.patch_len - values_CL.shape[1]
            tiles = tile_windows(n_patches, window_patches, overlap_patches, Keep.CENTRE)
            # sample range of each tile; the first one starts inside the left padding
            pieces = [
                (values_CL[:, max(0, t.start * cfg.patch_len - padded) : t.end * cfg.patch_len - padded], t)
                for t in tiles
            ]
            stitched_XTE: Optional[np.ndarray] = None
            if padded:  # the first window is shorter in samples (its first patch is partial): on its own
                batches = [pieces[:1], *same_length_batches(pieces[1:], batch_size)]
            else:
                batches = list(same_length_batches(pieces, batch_size))
            for batch in batches:
                context_BCL = torch.from_numpy(np.stack([window_CL for window_CL, _ in batch])).to(self.device)
                with self._autocast():
                    hidden_BXTE = network.patch_embeddings(context_BCL, layer).float().cpu().numpy()
                if stitched_XTE is None:
                    stitched_XTE = np.empty((hidden_BXTE.shape[1], n_patches, hidden_BXTE.shape[3]), np.float32)
                for (_, tile), hidden_XTE in zip(batch, hidden_BXTE):
                    keep = slice(tile.keep_start - tile.start, tile.keep_end - tile.start)
                    stitched_XTE[:, tile.keep_start : tile.keep_end] = hidden_XTE[:, keep]
            outputs.append(pool_tokens(stitched_XTE, pooling))
        if like is torch.Tensor:
            return [torch.from_numpy(array) for array in outputs]
        return outputs

    # --------------------------------------------------------------------------------- inputs
    def _as_series(self, series: SeriesInput) -> tuple[list[np.ndarray], str, type]:
        """(float32 (C, L) arrays, input layout "1d" | "2d" | "batch", numpy or torch type),
        checking channels, length and finiteness."""
        like = (
            torch.Tensor
            if isinstance(series, torch.Tensor)
            or (isinstance(series, (list, tuple)) and series and isinstance(series[0], torch.Tensor))
            else np.ndarray
        )
        if isinstance(series, (np.ndarray, torch.Tensor)):
            array = _to_numpy(series)
            if array.ndim == 1:
                items, layout = [array[None]], "1d"
            elif array.ndim == 2:
                items, layout = [array], "2d"
            elif array.ndim == 3:
                items, layout = list(array), "batch"
            else:
                raise ValueError(
                    f"a series must be (length,), (channels, length) or a batch (series, channels, length); "
                    f"got shape {array.shape}."
                )
        elif isinstance(series, (list, tuple)):
            items, layout = [], "batch"
            for index, item in enumerate(series):
                array = _to_numpy(item)
                if array.ndim not in (1, 2):
                    raise ValueError(
                        f"series {index} has shape {array.shape}; each must be (length,) or (channels, length)."
                    )
                items.append(array[None] if array.ndim == 1 else array)
            if not items:
                raise ValueError("no series given: the list is empty.")
        else:
            raise TypeError(
                f"series must be a numpy array, a torch tensor or a list of them, got {type(series).__name__}."
            )
        cfg = self.config
        for index, values_CL in enumerate(items):
            if not cfg.channel_independent and values_CL.shape[0] != cfg.n_channels:
                raise ValueError(
                    f"series {index} has {values_CL.shape[0]} channel(s) but the model was trained on "
                    f"{cfg.n_channels}; a 2-D input is one series (channels, length): stack several "
                    "univariate series as (series, 1, length) or pass a list."
                )
            if values_CL.shape[1] < cfg.patch_len:
                raise ValueError(
                    f"series {index} has {values_CL.shape[1]} samples, shorter than one patch "
                    f"({cfg.patch_len} samples); give at least {cfg.patch_len}."
                )
            bad = np.isinf(values_CL)
            if bad.any():
                channel, position = (int(v) for v in np.argwhere(bad)[0])
                raise ValueError(
                    f"series {index} holds {int(bad.sum())} infinite value(s), the first at channel {channel}, "
                    f"position {position}; mark a value as missing with NaN (the model masks missing values)."
                )
        return [np.ascontiguousarray(v, dtype=np.float32) for v in items], layout, like


def _to_numpy(value: Union[np.ndarray, torch.Tensor]) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", torch.float32).numpy()
    if not isinstance(value, np.ndarray):
        raise TypeError(f"series must be numpy arrays or torch tensors, got {type(value).__name__}.")
    return value.astype(np.float32, copy=False)


def _restore(arrays_CX: list[np.ndarray], layout: str, like: type) -> Union[np.ndarray, torch.Tensor, list]:
    """Undo the input layout: one array per series (C, X...) back to (N, C, X...), (C, X...) for
    2-D input, (X...) for 1-D; a batch of series with different channel counts (which only a
    channel-independent model takes) stays a list."""
    if layout == "1d":
        out = arrays_CX[0][0]
    elif layout == "2d":
        out = arrays_CX[0]
    elif len({array.shape for array in arrays_CX}) == 1:
        out = np.stack(arrays_CX)
    else:
        return [torch.from_numpy(array) if like is torch.Tensor else array for array in arrays_CX]
    return torch.from_numpy(np.ascontiguousarray(out)) if like is torch.Tensor else out
