"""LightningModule for time-series forecasting: `TimeSeriesTransformer` + MSE/pinball + AdamW.

Batches come from `genoformer.data.timeseries.datamodule.TimeSeriesDataModule`:
{"context": float32 (B, C, Lc), "target": float32 (B, C, H), ...}; the data module's horizon
must equal the model's (configs link them). Contexts and targets may hold missing values (NaN):
the model masks them in its input, and every loss and metric is taken over the observed targets
only (the datasets skip windows with none). Training base (runtime settings, exact resume, tagged
checkpoints, AdamW schedule): `genoformer.core.training.TrainingModule`. Metrics (per split: train, val, test):
    <split>/loss      the training objective: MSE of the point forecast (+ mean pinball loss
                      when the model has quantiles); with forecast.every_token, in training, of
                      every context token's forecast
    <split>/mse, /mae of the point forecast, on the data module's (z-scored) values
    val/mse_store_mean  only with a data module of several stores (its `store_names`; batches
                      carry each window's `store` index): the mean over stores of each store's
                      MSE, its squared errors summed over the epoch and all ranks over their
                      count, so that a store with many windows weighs no more than one with few
                      (val/mse weighs every window alike); stores no validation window reached
                      are left out, with a warning
    val/mse/<store>   that MSE of each store, by the data module's store name

Shape legend: B batch, C channels, L context samples, H horizon samples, K quantile levels.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from genoformer.core.checkpoints import ModelKind
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.training import OptimizerSettings, TrainingModule
from genoformer.core.transformer import TransformerConfig
from genoformer.progress import tqdm
from genoformer.timeseries.baselines import DirectAR, fill_short_gaps
from genoformer.timeseries.model import ForecastConfig, TimeSeriesTransformer, pinball_loss, token_targets
from genoformer.timeseries.protocol import PROTOCOL_HORIZONS, ProtocolSplit


def _context_and_target(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    if "context" not in batch or "target" not in batch:
        raise TypeError(
            f"TimeSeriesForecaster trains on time-series batches ({{'context': (B, C, L), 'target': (B, C, H)}}, as "
            f"TimeSeriesDataModule gives), got a batch with keys {sorted(batch)}; genome batches train "
            "genoformer.genome.lm.GenoformerLM."
        )
    return batch["context"], batch["target"]


def stretch_time(context_BCL: torch.Tensor, target_BCH: torch.Tensor, rate: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow a window down by `rate` >= 1 around the forecast origin, keeping both lengths.

    With the origin at time 0 (context at times -L..-1, target at 0..H-1), the stretched window
    at time t holds the original value at t / rate, linearly interpolated (float32)."""
    L, H = context_BCL.shape[-1], target_BCH.shape[-1]
    series_BCN = torch.cat([context_BCL, target_BCH], dim=-1).float()
    position_N = torch.arange(-L, H, device=series_BCN.device, dtype=torch.float64) / rate + L
    left_N = position_N.floor().long().clamp(max=L + H - 2)
    weight_N = (position_N - left_N).to(series_BCN.dtype)
    stretched_BCN = series_BCN[..., left_N] * (1 - weight_N) + series_BCN[..., left_N + 1] * weight_N
    return stretched_BCN[..., :L], stretched_BCN[..., L:]


def masked_mean(values: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
    """The mean of `values` where `observed` (bool, same shape) is true; 0 where nothing is."""
    return torch.where(observed, values, 0.0).sum() / observed.sum().clamp(min=1)


class TimeSeriesForecaster(TrainingModule):
    """A forecaster: `TimeSeriesTransformer` trained on context/horizon windows."""

    kind = ModelKind.FORECASTER

    def __init__(
        self,
        transformer: TransformerConfig,
        forecast: ForecastConfig,
        lookback_jitter: float = 0.0,
        time_stretch: float = 0.0,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 200,
        total_steps: Optional[int] = None,
        min_lr_ratio: float = 0.05,
        seed: int = 0,
        linear_fit_batches: int = 64,
        linear_orders: Optional[list[int]] = None,
        runtime: Optional[RuntimeSettings] = None,
    ) -> None:
        """
        Args:
            transformer: the trunk; `causal` picks causal or bidirectional attention, `attention`
                dense or block-sparse layers; `vocab_size` and `tie_embeddings` are unused. A mapping
                in the layout of `TransformerConfig.to_dict()` is accepted too (checkpoints store that).
            forecast: patch length, context, horizon, channels, quantiles (`ForecastConfig`).
            lookback_jitter: fraction of training batches whose look-back is cut to a random
                length (log-uniform between one patch and the context), so that the model also
                forecasts well from short inputs.
            time_stretch: augmentation against memorising a short training series: each
                training batch is slowed down by a random factor r in [1, 1 + time_stretch]
                (linear interpolation around the forecast origin: the last L / r context samples
                become L, the first H / r target samples become H). 0 turns it off. For series
                whose dynamics keep their shape at other speeds (heartbeats, gait, machinery).
            learning_rate: peak AdamW learning rate, reached after warmup.
            weight_decay: AdamW weight decay for matrices.
            betas: AdamW (beta1, beta2).
            warmup_steps: optimizer steps of linear warmup.
            total_steps: optimizer steps at which the cosine decay ends; None: the trainer's
                estimated_stepping_batches (from max_steps or max_epochs).
            min_lr_ratio: final learning rate as a fraction of learning_rate.
            seed: seed of the look-back jitter and the time stretch.
            linear_fit_batches: training batches (as the data module gives them, before time
                stretch and look-back jitter) that the least-squares fit of the linear path
                (`forecast.linear_order`) reads when training starts; only forecasts whose lags and
                targets are observed count, so a series with long gaps needs more.
            linear_orders: Fit the linear path instead as the AR baseline is fitted
                (`genoformer.timeseries.protocol.DirectAR.fit_select`): least squares on every
                window of the training part of every series (gaps of up to 32 steps filled), with
                the order chosen on the validation part among these orders (those up to
                forecast.linear_order), separately for each band of the protocol's horizons
                (steps 1-96, 97-192, 193-336, 337-720, then the rest): the trunk then starts from
                the best linear forecaster of the data and learns what it misses. Needs a data
                module that splits by region without window normalization
                (`TimeSeriesDataModule.series_with_splits`). None: fit on `linear_fit_batches`.
            runtime: how to run (attention backend, activation checkpointing, fused regions,
                compile): `genoformer.core.runtime.RuntimeSettings`; never saved in checkpoints.
        """
        super().__init__(runtime)
        if isinstance(transformer, Mapping):
            transformer = TransformerConfig.from_dict(transformer)
        if isinstance(forecast, Mapping):
            forecast = ForecastConfig.from_dict(forecast)
        if not 0.0 <= lookback_jitter <= 1.0:
            raise ValueError(f"lookback_jitter must be in [0, 1], got {lookback_jitter}.")
        self.forecast_config = forecast
        if time_stretch < 0.0:
            raise ValueError(f"time_stretch must be at least 0, got {time_stretch}.")
        if linear_fit_batches < 1:
            raise ValueError(f"linear_fit_batches must be at least 1, got {linear_fit_batches}.")
        self.linear_fit_batches = linear_fit_batches
        if linear_orders is not None and not [order for order in linear_orders if 1 <= order <= forecast.linear_order]:
            raise ValueError(
                f"linear_orders {list(linear_orders)} has no order in [1, forecast.linear_order="
                f"{forecast.linear_order}]: name orders up to it, or raise forecast.linear_order"
            )
        self.linear_orders = None if linear_orders is None else sorted({int(order) for order in linear_orders})
        self.lookback_jitter = lookback_jitter
        self.time_stretch = time_stretch
        self.optimization = OptimizerSettings.of(locals())
        self.model = TimeSeriesTransformer(transformer, forecast, self.runtime)
        self._jitter_rng = np.random.default_rng(seed)
        self._store_totals_2S: Optional[torch.Tensor] = None  # per store, over a validation epoch
        self.save_hyperparameters(
            {
                "transformer": transformer.to_dict(),
                "forecast": forecast.to_dict(),
                "lookback_jitter": lookback_jitter,
                "time_stretch": time_stretch,
                **self.optimization.to_dict(),
                "seed": seed,
                "linear_fit_batches": linear_fit_batches,
                "linear_orders": self.linear_orders,
            }
        )

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.forecast_config.linear_order and not bool(self.model.linear_fitted):
            self.fit_linear_path()

    def fit_linear_path(self) -> None:
        """Least-squares fit of the model's linear path on `linear_fit_batches` training batches
        (summed over ranks, so every rank gets the same coefficients), or with `linear_orders` on
        whole series (`fit_linear_path_as_ar`). Runs once: the fitted coefficients travel in
        checkpoints, and a resumed run keeps them."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None:
            raise ValueError(
                "forecast.linear_order fits its linear path on training windows from a data module: train with "
                "`genoformer fit` and a TimeSeriesDataModule under `data:` (or set forecast.linear_order to 0)."
            )
        if self.linear_orders is not None:
            self.fit_linear_path_as_ar(datamodule.series_with_splits())
            return
        started = time.perf_counter()
        sums: Optional[list[torch.Tensor]] = None
        batches = tqdm(
            itertools.islice(datamodule.train_dataloader(), self.linear_fit_batches),
            total=self.linear_fit_batches,
            desc="fitting the linear path",
            disable=self.global_rank != 0,
        )
        for batch in batches:
            parts = self.model.linear_normal_equations(*_context_and_target(batch))
            sums = list(parts) if sums is None else [total + part for total, part in zip(sums, parts)]
        if sums is None:
            raise ValueError("the data module gave no training batch to fit the linear path on.")
        gram, cross, y_square, rows = (self.trainer.strategy.reduce(part, reduce_op="sum") for part in sums)
        if int(rows) <= self.forecast_config.linear_order:  # the ridge keeps the solve finite, not good
            rank_zero_warn(
                f"only {int(rows)} forecasts of the {self.linear_fit_batches} fit batches have all their "
                f"{self.forecast_config.linear_order} lags and targets observed, fewer than the linear path's "
                f"{self.forecast_config.linear_order + 1} coefficients: raise model.init_args.linear_fit_batches or "
                "lower model.init_args.forecast.linear_order (the series may have too many long gaps)."
            )
        solution = self.model.set_linear(gram, cross)
        residual = y_square - 2 * (solution * cross).sum() + (solution * (gram @ solution)).sum()
        values = float(rows) * self.forecast_config.horizon
        rank_zero_info(
            f"linear path (order {self.forecast_config.linear_order}): least squares on {int(rows)} "
            f"forecasts in {time.perf_counter() - started:.1f} s; there, in the data's units, "
            f"its MSE is {float(residual) / values:.4f}, the targets' mean square"
            f"{' about their window mean' if self.forecast_config.linear_centered else ''} "
            f"{float(y_square) / values:.4f}"
        )

    def fit_linear_path_as_ar(self, series: list[tuple[np.ndarray, int, int]]) -> dict[int, dict[str, Any]]:
        """Set the linear path to direct AR fitted as the AR baseline is, band by band of the
        protocol's horizons (see `linear_orders`): for the band ending at horizon h, the model of
        `DirectAR.fit_select` for horizon h, order chosen on validation, gives the forecasts of
        the band's steps (a model of order p fills the last p of the path's lags, zeros before).
        `series`: (values (C, T), train_end, val_end) per series, as
        `TimeSeriesDataModule.series_with_splits` gives them. Deterministic, so every rank sets
        the same path. Returns, per band end, the order chosen and the validation MSE of each order tried."""
        cfg = self.forecast_config
        started = time.perf_counter()
        values = [fill_short_gaps(values_CT) for values_CT, _, _ in series]
        splits = [ProtocolSplit(values_CT.shape[1], train_end, val_end) for values_CT, train_end, val_end in series]
        orders = [order for order in self.linear_orders if order <= cfg.linear_order]
        ends = sorted({h for h in PROTOCOL_HORIZONS if h < cfg.horizon} | {cfg.horizon})
        coef_PH = np.zeros((cfg.linear_order, cfg.horizon))
        bias_H = np.zeros(cfg.horizon)
        chosen: dict[int, dict[str, Any]] = {}
        start = 0
        for end in tqdm(ends, desc="fitting the linear path as AR", disable=self.global_rank != 0):
            ar, scores = DirectAR.fit_select(values, splits, end, orders)
            coef_PH[cfg.linear_order - ar.order :, start:end] = ar.coef_PH[:, start:end]
            bias_H[start:end] = ar.intercept_H[start:end]
            chosen[end] = {"order": ar.order, "validation_mse": scores}
            start = end
        self.model.set_linear_coefficients(torch.from_numpy(coef_PH), torch.from_numpy(bias_H))
        rank_zero_info(
            f"linear path: direct AR on {len(series)} series in {time.perf_counter() - started:.1f} s, "
            "orders chosen on validation by horizon band: "
            + ", ".join(
                f"steps to {end}: {c['order']} (validation MSE {c['validation_mse'][c['order']]:.4f})"
                for end, c in chosen.items()
            )
        )
        return chosen

    def forward(self, context_BCL: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(point (B, C, H), quantiles (B, C, H, K) or None)."""
        return self.model(context_BCL)

    def losses(self, context_BCL: torch.Tensor, target_BCH: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"loss", "mse", "mae"} of one batch (0-d tensors)."""
        return self._losses_and_errors(context_BCL, target_BCH)[0]

    def _losses_and_errors(
        self, context_BCL: torch.Tensor, target_BCH: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """(`losses`, the point forecast's error (B, C, H), where its target is observed (B, C, H))."""
        cfg = self.forecast_config
        if target_BCH.shape[-1] != cfg.horizon:
            raise ValueError(
                f"the batches have horizon {target_BCH.shape[-1]} but the model predicts {cfg.horizon}; "
                "set data.init_args.horizon to model.init_args.forecast.horizon."
            )
        if context_BCL.shape[-1] > cfg.context:
            context_BCL = context_BCL[..., -cfg.context :]
        target_BCH = target_BCH.float()
        if cfg.every_token and self.training:  # every context token learns to forecast what follows it
            first = cfg.trained_tokens(context_BCL.shape[-1])  # the tokens after the statistics' part
            out_BCTHK1 = self.model.token_forecasts(context_BCL, first)
            targets_BCTH = token_targets(context_BCL, target_BCH, cfg.patch_len)[:, :, first:]
            observed_BCTH = torch.isfinite(targets_BCTH)
            targets_BCTH = torch.where(observed_BCTH, targets_BCTH, 0.0)
            loss = masked_mean(torch.square(out_BCTHK1[..., 0] - targets_BCTH), observed_BCTH)
            if out_BCTHK1.shape[-1] > 1:
                loss = loss + pinball_loss(
                    out_BCTHK1[..., 1:], targets_BCTH, self.model.quantile_levels_K, observed_BCTH
                )
            point_BCH = out_BCTHK1[:, :, -1, :, 0]  # the series' own forecast: the last token's
            observed_BCH = observed_BCTH[:, :, -1]
            error_BCH = point_BCH - targets_BCTH[:, :, -1]
            return (
                {
                    "loss": loss,
                    "mse": masked_mean(torch.square(error_BCH), observed_BCH),
                    "mae": masked_mean(error_BCH.abs(), observed_BCH),
                },
                error_BCH,
                observed_BCH,
            )
        point_BCH, quantiles_BCHK = self.model(context_BCL)
        observed_BCH = torch.isfinite(target_BCH)
        target_BCH = torch.where(observed_BCH, target_BCH, 0.0)
        error_BCH = point_BCH - target_BCH
        mse = masked_mean(torch.square(error_BCH), observed_BCH)
        loss = mse
        if quantiles_BCHK is not None:
            loss = loss + pinball_loss(quantiles_BCHK, target_BCH, self.model.quantile_levels_K, observed_BCH)
        values = {"loss": loss, "mse": mse, "mae": masked_mean(error_BCH.abs(), observed_BCH)}
        return values, error_BCH, observed_BCH

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        context_BCL, target_BCH = _context_and_target(batch)
        cfg = self.forecast_config
        if self.time_stretch > 0:
            rate = 1.0 + self._jitter_rng.uniform(0.0, self.time_stretch)
            context_BCL, target_BCH = stretch_time(context_BCL, target_BCH, rate)
        if self.lookback_jitter > 0 and self._jitter_rng.random() < self.lookback_jitter:
            longest = min(cfg.context, context_BCL.shape[-1])
            keep = int(math.exp(self._jitter_rng.uniform(math.log(cfg.patch_len), math.log(longest))))
            context_BCL = context_BCL[..., -max(cfg.patch_len, keep) :]
        values = self.losses(context_BCL, target_BCH)
        batch_size = context_BCL.shape[0]
        self.log("train/loss", values["loss"], prog_bar=True, batch_size=batch_size)
        self.log("train/mse", values["mse"], batch_size=batch_size)
        return values["loss"]

    def on_validation_epoch_start(self) -> None:
        names = self._store_names()
        # row 0: squared errors summed per store, row 1: how many observed target values they are
        self._store_totals_2S = torch.zeros(2, len(names), dtype=torch.float64, device=self.device) if names else None

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        totals_2S, self._store_totals_2S = self._store_totals_2S, None
        if totals_2S is None:
            return
        totals_2S = self.trainer.strategy.reduce(totals_2S, reduce_op="sum")  # every rank's windows, on every rank
        names = self._store_names()
        seen_S = totals_2S[1] > 0
        seen = seen_S.tolist()
        if not any(seen):
            return
        if not all(seen) and not self.trainer.sanity_checking:
            missing = [name for name, scored in zip(names, seen) if not scored]
            rank_zero_warn(
                f"val/mse_store_mean leaves out the stores {missing}: no validation window of theirs was "
                "scored. Either their validation split is empty (see data.init_args.split), or "
                "trainer.limit_val_batches cut the validation set short: it tiles the stores one after "
                "another, so raise the limit (1.0: all of it) until every store is reached."
            )
        mse_S = totals_2S[0] / totals_2S[1].clamp(min=1)
        metrics = {"val/mse_store_mean": mse_S[seen_S].mean()}
        metrics.update({f"val/mse/{name}": mse_S[s] for s, name in enumerate(names) if seen[s]})
        # equal on every rank already: sync_dist averages equal values (and keeps Lightning from warning)
        self.log_dict({name: value.float() for name, value in metrics.items()}, sync_dist=True)

    def _store_names(self) -> list[str]:
        """The names of the data module's stores, which the batches' `store` index points into,
        when it has several; else []."""
        names = list(getattr(getattr(self.trainer, "datamodule", None), "store_names", None) or [])
        return names if len(names) > 1 else []

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], split: str) -> None:
        context_BCL, target_BCH = _context_and_target(batch)
        values, error_BCH, observed_BCH = self._losses_and_errors(context_BCL, target_BCH)
        for name, value in values.items():
            self.log(
                f"{split}/{name}",
                value,
                prog_bar=split == "val" and name == "mse",
                batch_size=context_BCL.shape[0],
                sync_dist=True,
            )
        totals_2S = self._store_totals_2S if split == "val" else None
        if totals_2S is not None:
            if "store" not in batch:
                raise TypeError(
                    f"with several stores, validation batches must say which store each window is from "
                    f"(a 'store' index, as TimeSeriesDataModule gives), got keys {sorted(batch)}"
                )
            squares_B = torch.where(observed_BCH, torch.square(error_BCH), 0.0).sum(dim=(1, 2), dtype=totals_2S.dtype)
            counts_B = observed_BCH.sum(dim=(1, 2), dtype=totals_2S.dtype)
            totals_2S.index_add_(1, batch["store"].to(totals_2S.device), torch.stack([squares_B, counts_B]))
