"""Time-series forecasters on the shared transformer trunk: patches of values in, a horizon out.

A window of C channels and L samples is instance-normalised per channel (its mean and standard
deviation are kept to undo it), cut into patches of `patch_len` samples aligned to the window's
end (the first patch is left-padded when L is not a multiple, and an observed-mask tells the model
which samples are padding), and each patch becomes one token. After the context tokens come
ceil(horizon / patch_len) forecast tokens (learned vectors, one per horizon patch); the trunk
(`genoformer.core.transformer.TransformerTrunk`: causal or bidirectional, dense or block-sparse attention
through `genoformer.kernels.dispatch.attention`) runs over all of them, and a linear head turns
each forecast token into `patch_len` future values: the point forecast (trained with MSE) and,
when configured, quantiles (trained with the pinball loss). The horizon is predicted directly, in
one pass. With `every_token` (decoder-style, causal attention) there are no forecast tokens: a
linear head turns every context token into the whole horizon after its patch, all of them are
trained (`token_targets`), and the last token's is the forecast. With `linear_order`, a fixed
least-squares linear forecast from the samples before each forecasting token is added to the
head's (scaled) output: the trunk learns what the linear forecast misses.

Channels are independent by default (every channel is its own sequence through the same weights,
so any one channel sees only its own past, and the model forecasts series of any number of
channels); with `channel_independent: false` one token holds the patch of every channel.

Missing values: NaN (or infinite) samples of the context are unobserved. The instance statistics
come from the observed samples only, an unobserved sample enters its patch as 0 (the window's
mean, after normalisation) with observed-mask 0, the same mask that marks the left padding, and
the linear path reads the last observed value before it (the window's mean before the first), as
the baselines' look-backs do (`genoformer.timeseries.baselines.fill_lookback`). The linear path is
fitted only on forecasts whose lags and targets are observed, once gaps of at most
`FIT_FILL_LIMIT` samples are filled the same way (as the AR baseline is fitted): a series with
scattered missing values leaves almost no window whole, and lags filled across long gaps are not
what the path forecasts from at test time. Fully observed windows give what they gave before the
mask existed (the parameters are the same), so older checkpoints load and forecast as they did.

Shape legend: B batch, C channels, G channels per token (1, or C when joint), S sequences
through the trunk (B * C, or B), L context samples, T context tokens, Q forecast tokens,
P patch length, H horizon samples, K quantile levels, E model width.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerConfig, TransformerTrunk
from genoformer.timeseries.baselines import FIT_FILL_LIMIT


@dataclasses.dataclass
class ForecastConfig:
    """What a forecaster reads and predicts. Every field can be set from YAML.

    Attributes:
        patch_len: Samples per token P (1: one token per sample).
        context: Longest look-back in samples; longer inputs use their last `context` samples.
        horizon: Longest forecast in samples; the model predicts it in one pass.
        n_channels: Channels C of the series the model is trained on. A channel-independent model
            forecasts series of any number of channels; a joint one needs exactly these.
        channel_independent: Every channel is its own sequence through shared weights (the
            default); false: one token holds the patch of every channel.
        quantiles: Quantile levels in (0, 1) for a quantile head trained with the pinball loss
            beside the point head; empty: point forecasts only.
        norm_eps: Added to the variance of instance normalisation (constant windows stay finite).
        every_token: Decoder-style training (needs causal attention): every context token is
            trained to forecast the `horizon` samples that follow its patch, so one window
            teaches T forecasts instead of one; the forecast of a series comes from its last
            context token, and no forecast tokens are appended. The window's instance statistics
            are shared by all its tokens (see stats_fraction). False: one forecast per window, from forecast tokens
            after the context.
        stats_fraction: Instance statistics come from the first `stats_fraction` of each window
            (at least one patch); 1: the whole window. every_token models need less than 1: a
            token's targets follow its patch, inside the window for all but the last token, so
            whole-window statistics would tell early tokens about their own future. Only tokens
            whose patch ends at or after the statistics' part are trained (`trained_tokens`).
        linear_order: Lags p of a linear autoregressive path beside the trunk (0: none): every
            forecast is a direct multi-horizon linear forecast from the p samples before it (in
            the input's units; zeros stand in where the look-back is shorter) plus the head's
            output times the window's scale, so the trunk learns what the linear forecast
            misses. The coefficients are fitted by least squares on training windows when
            training starts, on the forecasts whose lags (inside the window) and targets are
            observed (`linear_normal_equations`, `set_linear`, called by
            `TimeSeriesForecaster.on_fit_start`) and stay fixed: gradient descent on the same
            path did not find the least-squares filter, and a fit in the instance-normalised
            space weighs each window by 1 / scale^2, which is not the MSE that forecasts are
            scored by (BENCHMARKS.md, "Time series: ECG").
        linear_centered: The linear path forecasts m + W (x - m) + s b (m, s the instance
            statistics) instead of W x + b, still fitted by least squares in the input's units.
            Then the whole model is shift- and scale-equivariant (forecasting a x + c gives
            a f(x) + c), which a model needs when it forecasts windows in other units than it was
            trained on: a general forecaster trained with window_normalize (zero-mean, unit-scale
            windows) and scored on z-scored stores, where the uncentered path is biased. False
            keeps older checkpoints' forecasts.
    """

    patch_len: int = 16
    context: int = 8192
    horizon: int = 720
    n_channels: int = 1
    channel_independent: bool = True
    quantiles: list[float] = dataclasses.field(default_factory=list)
    norm_eps: float = 1e-5
    every_token: bool = False
    stats_fraction: float = 1.0
    linear_order: int = 0
    linear_centered: bool = False

    def __post_init__(self) -> None:
        self.quantiles = [float(q) for q in self.quantiles]
        for name in ("patch_len", "context", "horizon", "n_channels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.context < self.patch_len:
            raise ValueError(f"context ({self.context}) must hold at least one patch of {self.patch_len} samples.")
        if any(not 0.0 < q < 1.0 for q in self.quantiles) or sorted(set(self.quantiles)) != self.quantiles:
            raise ValueError(f"quantiles must be increasing, distinct and in (0, 1), got {self.quantiles}.")
        if not 0 <= self.linear_order <= self.context:
            raise ValueError(f"linear_order must be in [0, context={self.context}], got {self.linear_order}.")
        if not 0.0 < self.stats_fraction <= 1.0:
            raise ValueError(f"stats_fraction must be in (0, 1], got {self.stats_fraction}.")
        if self.every_token and self.stats_fraction == 1.0:
            raise ValueError(
                "every_token trains each token on the samples after its patch, which whole-window "
                "statistics would reveal to it: set forecast.stats_fraction below 1 (0.25 keeps the "
                "last three quarters of every window's tokens trained)."
            )

    @property
    def context_tokens(self) -> int:
        return math.ceil(self.context / self.patch_len)

    @property
    def horizon_tokens(self) -> int:
        return math.ceil(self.horizon / self.patch_len)

    @property
    def channels_per_token(self) -> int:
        return 1 if self.channel_independent else self.n_channels

    def stats_samples(self, length: int) -> int:
        """How many leading samples of a window of `length` give its instance statistics."""
        return min(length, max(self.patch_len, int(self.stats_fraction * length)))

    def trained_tokens(self, length: int) -> int:
        """every_token models: the index of the first token trained in a window of `length`
        samples, the first whose patch ends at or after the statistics' part (patches align to
        the window's end: token t of T ends at sample length - (T - 1 - t) * patch_len)."""
        T = math.ceil(length / self.patch_len)
        return T - 1 - (length - self.stats_samples(length)) // self.patch_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ForecastConfig:
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class InstanceStats:
    """Per-window, per-channel statistics of instance normalisation: mean and scale (B, C, 1)."""

    mean_BC1: torch.Tensor
    scale_BC1: torch.Tensor

    def undo(self, y_BCX: torch.Tensor) -> torch.Tensor:
        """Back to the input's units: y * scale + mean (any trailing length X; extra trailing
        dims such as quantiles need the stats unsqueezed by the caller)."""
        return y_BCX * self.scale_BC1 + self.mean_BC1


def instance_normalize(
    x_BCL: torch.Tensor, eps: float = 1e-5, samples: Optional[int] = None, observed_BCL: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, InstanceStats]:
    """(x - mean) / sqrt(var + eps) per window and channel, in float32, with the statistics (of
    the first `samples` samples when given, else of the whole window). With `observed_BCL`
    (bool), the statistics count observed samples only and unobserved ones come out as 0 (a
    channel with no observed sample gets mean 0)."""
    x_BCL = x_BCL.float()
    if observed_BCL is None:
        part_BCS = x_BCL if samples is None else x_BCL[..., :samples]
        mean_BC1 = part_BCS.mean(dim=-1, keepdim=True)
        scale_BC1 = torch.sqrt(part_BCS.var(dim=-1, keepdim=True, unbiased=False) + eps)
        return (x_BCL - mean_BC1) / scale_BC1, InstanceStats(mean_BC1, scale_BC1)
    mask_BCL = observed_BCL.to(x_BCL.dtype)
    x_BCL = torch.where(observed_BCL, x_BCL, 0.0)
    part_BCS, weight_BCS = (x_BCL, mask_BCL) if samples is None else (x_BCL[..., :samples], mask_BCL[..., :samples])
    count_BC1 = weight_BCS.sum(dim=-1, keepdim=True).clamp(min=1.0)
    mean_BC1 = part_BCS.sum(dim=-1, keepdim=True) / count_BC1
    var_BC1 = (torch.square(part_BCS - mean_BC1) * weight_BCS).sum(dim=-1, keepdim=True) / count_BC1
    scale_BC1 = torch.sqrt(var_BC1 + eps)
    return (x_BCL - mean_BC1) / scale_BC1 * mask_BCL, InstanceStats(mean_BC1, scale_BC1)


def patchify(
    x_SGL: torch.Tensor, patch_len: int, observed_SGL: Optional[torch.Tensor] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut (S, G, L) into T = ceil(L / P) patches aligned to the end; the first is left-padded
    with zeros. Returns values (S, T, G * P) and the observed mask (S, T, G * P), 1.0 for real
    samples (those `observed_SGL` marks, when given) and 0.0 for padding and unobserved ones, in
    the layout [channel 0's P samples, channel 1's, ...] per token."""
    S, G, L = x_SGL.shape
    T = math.ceil(L / patch_len)
    pad = T * patch_len - L
    values_SGL = nn.functional.pad(x_SGL, (pad, 0))
    observed = torch.ones_like(x_SGL) if observed_SGL is None else observed_SGL.to(x_SGL.dtype)
    observed_SGL = nn.functional.pad(observed, (pad, 0))

    def tokens(v_SGL: torch.Tensor) -> torch.Tensor:
        return v_SGL.view(S, G, T, patch_len).transpose(1, 2).reshape(S, T, G * patch_len)

    return tokens(values_SGL), tokens(observed_SGL)


class TimeSeriesTransformer(TransformerTrunk):
    """Context windows (B, C, L) -> point forecasts (B, C, H) and quantiles (B, C, H, K)."""

    def __init__(
        self, config: TransformerConfig, forecast: ForecastConfig, runtime: Optional[RuntimeSettings] = None
    ) -> None:
        if forecast.every_token and not config.causal:
            raise ValueError(
                "forecast.every_token trains every context token on what follows it, which needs causal "
                "attention: set transformer.causal to true (or every_token to false)."
            )
        needed = forecast.context_tokens + (0 if forecast.every_token else forecast.horizon_tokens)
        if config.max_seq_len < needed:
            raise ValueError(
                f"max_seq_len={config.max_seq_len} is too short for {forecast.context_tokens} context tokens "
                f"(context {forecast.context} / patch_len {forecast.patch_len}) plus {forecast.horizon_tokens} "
                f"forecast tokens (horizon {forecast.horizon}); set transformer.max_seq_len to at least {needed}."
            )
        width = forecast.channels_per_token * forecast.patch_len
        super().__init__(config, nn.Linear(2 * width, config.d_model), runtime)
        self.forecast_config = forecast
        self.n_outputs = 1 + len(forecast.quantiles)
        if forecast.every_token:  # each context token -> the whole horizon of its channels
            self.head = nn.Linear(config.d_model, forecast.channels_per_token * forecast.horizon * self.n_outputs)
        else:  # each forecast token -> one patch of the horizon
            self.horizon_queries_QE = nn.Parameter(torch.empty(forecast.horizon_tokens, config.d_model))
            self.head = nn.Linear(config.d_model, width * self.n_outputs)
        self.register_buffer(
            "quantile_levels_K", torch.tensor(forecast.quantiles, dtype=torch.float32), persistent=False
        )
        if forecast.linear_order:  # the linear path (fixed: buffers, saved in checkpoints); see set_linear
            self.register_buffer("linear_coef_PH", torch.zeros(forecast.linear_order, forecast.horizon))
            self.register_buffer("linear_bias_H", torch.zeros(forecast.horizon))
            self.register_buffer("linear_fitted", torch.tensor(False))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.init_std
        nn.init.normal_(self.embed.weight, std=std)
        nn.init.zeros_(self.embed.bias)
        if self.forecast_config.every_token and self.forecast_config.linear_order:
            # a zero head: training starts at the fitted linear path and the trunk adds only what it
            # learns (a fan-in head's noise, times the window's scale, made the untrained
            # per-dataset model six times worse than its linear path on traffic_volume)
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        elif self.forecast_config.every_token:
            # PyTorch's fan-in init: with init_std the every-token model of configs/ecg_8k_cpu.yaml
            # overfitted within 1,000 steps on the ECG (validation MSE rising from step 100)
            self.head.reset_parameters()
        else:
            nn.init.normal_(self.horizon_queries_QE, std=std)
            nn.init.normal_(self.head.weight, std=std)
            nn.init.zeros_(self.head.bias)
        self.reset_blocks()

    def check_input(self, context_BCL: torch.Tensor) -> None:
        """Shape, channel count, length and finiteness; ValueError saying what to pass."""
        cfg = self.forecast_config
        if context_BCL.ndim != 3:
            raise ValueError(f"context must be (batch, channels, length), got shape {tuple(context_BCL.shape)}.")
        if not cfg.channel_independent and context_BCL.shape[1] != cfg.n_channels:
            raise ValueError(
                f"the model takes {cfg.n_channels} channel(s) (forecast.n_channels, channels in one token), got "
                f"{context_BCL.shape[1]}; set model.init_args.forecast.n_channels to the store's number of channels."
            )
        if context_BCL.shape[2] < cfg.patch_len:
            raise ValueError(
                f"a series of {context_BCL.shape[2]} samples is shorter than one patch "
                f"({cfg.patch_len} samples); give at least {cfg.patch_len}."
            )
        if context_BCL.shape[2] > cfg.context:
            raise ValueError(
                f"context of {context_BCL.shape[2]} samples exceeds the model's {cfg.context}; pass its last "
                f"{cfg.context} samples."
            )

    def hidden(self, context_BCL: torch.Tensor, layer: int = -1) -> tuple[torch.Tensor, InstanceStats]:
        """Hidden states (S, T + Q, E) of `layer` for the context tokens followed by the forecast
        tokens (Q = 0 with every_token), and the instance statistics of the window."""
        self.check_input(context_BCL)
        cfg = self.forecast_config
        B, C, L = context_BCL.shape
        observed_BCL = torch.isfinite(context_BCL)
        x_BCL, stats = instance_normalize(context_BCL, cfg.norm_eps, cfg.stats_samples(L), observed_BCL)
        x_SGL = x_BCL.reshape(B * C, 1, L) if cfg.channel_independent else x_BCL
        observed_SGL = observed_BCL.reshape(x_SGL.shape)
        values_STW, observed_STW = patchify(x_SGL, cfg.patch_len, observed_SGL)
        tokens_STE = self.embed(torch.cat([values_STW, observed_STW], dim=-1))
        x_SNE = tokens_STE
        if not cfg.every_token:
            queries_SQE = self.horizon_queries_QE.to(tokens_STE.dtype).expand(tokens_STE.shape[0], -1, -1)
            x_SNE = torch.cat([tokens_STE, queries_SQE], dim=1)
        return self.run_blocks(x_SNE, None, self.resolve_layer(layer), keep_all=False)[-1], stats

    def forward(self, context_BCL: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(point forecasts (B, C, H) float32, quantiles (B, C, H, K) float32 or None), in the
        input's units, H = the configured horizon."""
        cfg = self.forecast_config
        if cfg.every_token:  # the last token's forecast: the head and the linear path run on it alone
            last_BCHK1 = self.token_forecasts(context_BCL, math.ceil(context_BCL.shape[-1] / cfg.patch_len) - 1)[
                :, :, 0
            ]
            return last_BCHK1[..., 0], (last_BCHK1[..., 1:] if self.n_outputs > 1 else None)
        B, C, _ = context_BCL.shape
        hidden_SNE, stats = self.hidden(context_BCL)
        Q, G, P, K1 = cfg.horizon_tokens, cfg.channels_per_token, cfg.patch_len, self.n_outputs
        out_SQX = self.head(hidden_SNE[:, -Q:]).float()  # X = G * P * K1
        out_BCHK1 = out_SQX.view(B, C // G, Q, G, P, K1).permute(0, 1, 3, 2, 4, 5).reshape(B, C, Q * P, K1)
        out_BCHK1 = out_BCHK1[:, :, : cfg.horizon]
        out_BCHK1 = out_BCHK1 * stats.scale_BC1.unsqueeze(-1)
        if cfg.linear_order:  # the linear forecast from the end of the context, plus the scaled head's
            last = hidden_SNE.shape[1] - Q - 1
            out_BCHK1 = out_BCHK1 + self.linear_forecasts(context_BCL, last, stats)[:, :, 0, :, None]
        else:
            out_BCHK1 = out_BCHK1 + stats.mean_BC1.unsqueeze(-1)
        point_BCH = out_BCHK1[..., 0]
        quantiles_BCHK = out_BCHK1[..., 1:] if K1 > 1 else None
        return point_BCH, quantiles_BCHK

    def token_forecasts(self, context_BCL: torch.Tensor, first: int = 0) -> torch.Tensor:
        """every_token models: the forecast of the `horizon` samples after its patch of each
        context token from token `first` on, (B, C, T - first, H, 1 + K) float32 in the input's
        units (point first, then quantiles); the head runs on those tokens only."""
        cfg = self.forecast_config
        B, C, _ = context_BCL.shape
        hidden_STE, stats = self.hidden(context_BCL)
        hidden_STE = hidden_STE[:, first:]
        G, T = cfg.channels_per_token, hidden_STE.shape[1]
        out_STX = self.head(hidden_STE).float()  # X = G * H * K1
        out_BCTHK1 = (
            out_STX.view(B, C // G, T, G, cfg.horizon, self.n_outputs)
            .transpose(2, 3)
            .reshape(B, C, T, cfg.horizon, self.n_outputs)
        )
        out_BCTHK1 = out_BCTHK1 * stats.scale_BC1[..., None, None]
        if cfg.linear_order:  # the linear forecasts, plus the scaled head's
            return out_BCTHK1 + self.linear_forecasts(context_BCL, first, stats)[..., None]
        return out_BCTHK1 + stats.mean_BC1[..., None, None]

    def linear_forecasts(self, context_BCL: torch.Tensor, first: int, stats: InstanceStats) -> torch.Tensor:
        """The linear path's forecasts from the end of every context token's patch from token
        `first` on, in the input's units: (B, C, T - first, H) float32; unobserved samples read
        as the window's mean (`stats`)."""
        x_BCL = fill_unobserved(context_BCL, stats)
        centered = self.forecast_config.linear_centered
        with torch.autocast(x_BCL.device.type, enabled=False):  # a long dot product: float32
            if centered:
                x_BCL = x_BCL - stats.mean_BC1
            lags_BCTP = lag_windows(x_BCL, self.forecast_config.linear_order, self.forecast_config.patch_len, first)
            if not centered:
                return lags_BCTP @ self.linear_coef_PH + self.linear_bias_H
            return (
                lags_BCTP @ self.linear_coef_PH
                + stats.scale_BC1[..., None] * self.linear_bias_H
                + stats.mean_BC1[..., None]
            )

    @torch.no_grad()
    def linear_normal_equations(
        self, context_BCL: torch.Tensor, target_BCH: torch.Tensor, fill_limit: int = FIT_FILL_LIMIT
    ) -> tuple[torch.Tensor, ...]:
        """One batch's share of the linear path's least-squares problem, at the positions the
        model forecasts from in training (every trained token with every_token, else the end of
        the context), in the input's units: (X^T X (p + 1, p + 1), X^T Y (p + 1, H), sum of Y^2,
        rows), float64, X the lags with a column of ones, Y the targets (with linear_centered: the
        lags and targets less the window's mean m, and the window's scale s for the ones, so that
        the fit is the least-squares m + W (x - m) + s b). Gaps of at most `fill_limit` samples in
        the context and target are filled with the last observed value (`fill_short_gaps`); a row
        is kept when all its lags and targets are then observed: lags before the window's start
        or across a longer gap would teach the path to forecast from filler."""
        cfg = self.forecast_config
        context_BCL = context_BCL[..., -cfg.context :].to(self.linear_coef_PH.device).float()
        target_BCH = target_BCH.to(self.linear_coef_PH.device).float()
        L, P = context_BCL.shape[-1], cfg.patch_len
        _, stats = instance_normalize(context_BCL, cfg.norm_eps, cfg.stats_samples(L), torch.isfinite(context_BCL))
        series_BCN = fill_short_gaps(torch.cat([context_BCL, target_BCH], dim=-1), fill_limit)
        context_BCL, target_BCH = series_BCN[..., :L], series_BCN[..., L:]
        if cfg.every_token:
            first = cfg.trained_tokens(L)
            y_BCTH = token_targets(context_BCL, target_BCH, P)[:, :, first:]
        else:
            first = math.ceil(L / P) - 1
            y_BCTH = target_BCH[:, :, None]
        x_BCL = fill_unobserved(context_BCL, stats)
        ones_BCT1 = torch.ones_like(y_BCTH[..., :1])
        if cfg.linear_centered:
            x_BCL = x_BCL - stats.mean_BC1
            y_BCTH = y_BCTH - stats.mean_BC1[..., None]
            ones_BCT1 = ones_BCT1 * stats.scale_BC1[..., None]
        y_NH = y_BCTH.reshape(-1, cfg.horizon).double()
        lags_NP = lag_windows(x_BCL, cfg.linear_order, P, first).reshape(-1, cfg.linear_order).double()
        observed_BCTP = lag_windows(
            torch.isfinite(context_BCL).float(), cfg.linear_order, P, first
        )  # 0 before the start
        whole_N = torch.isfinite(y_NH).all(dim=1) & observed_BCTP.reshape(-1, cfg.linear_order).bool().all(dim=1)
        y_NH, lags_NP = y_NH[whole_N], lags_NP[whole_N]
        x_NP1 = torch.cat([lags_NP, ones_BCT1.reshape(-1, 1).double()[whole_N]], dim=1)
        return (
            x_NP1.T @ x_NP1,
            x_NP1.T @ y_NH,
            y_NH.square().sum(),
            torch.tensor(float(len(x_NP1)), dtype=torch.float64),
        )

    @torch.no_grad()
    def set_linear(self, gram: torch.Tensor, cross: torch.Tensor, ridge: float = 1e-6) -> torch.Tensor:
        """Solve the linear path's normal equations (summed `linear_normal_equations`) and keep the
        coefficients; `ridge` (relative to the mean diagonal) only keeps the solve stable.
        Returns the solution (p + 1, H), float64."""
        p = self.forecast_config.linear_order
        gram = gram.clone()
        gram.diagonal()[:p] += ridge * gram.diagonal()[:p].mean()
        solution = torch.linalg.solve(gram, cross)
        self.set_linear_coefficients(solution[:p], solution[p])
        return solution

    @torch.no_grad()
    def set_linear_coefficients(self, coef_PH: torch.Tensor, bias_H: torch.Tensor) -> None:
        """Keep these coefficients (lags oldest first, as `lag_windows` gives them) and biases
        as the fitted linear path."""
        if tuple(coef_PH.shape) != tuple(self.linear_coef_PH.shape) or tuple(bias_H.shape) != tuple(
            self.linear_bias_H.shape
        ):
            raise ValueError(
                f"the linear path takes coefficients {tuple(self.linear_coef_PH.shape)} and biases "
                f"{tuple(self.linear_bias_H.shape)}, got {tuple(coef_PH.shape)} and {tuple(bias_H.shape)}"
            )
        self.linear_coef_PH.copy_(coef_PH)
        self.linear_bias_H.copy_(bias_H)
        self.linear_fitted.fill_(True)

    def patch_embeddings(self, context_BCL: torch.Tensor, layer: int = -1) -> torch.Tensor:
        """Hidden states of the context tokens (B, C', T, E), C' = C (channel-independent) or 1."""
        B = context_BCL.shape[0]
        hidden_SNE, _ = self.hidden(context_BCL, layer)
        T = math.ceil(context_BCL.shape[2] / self.forecast_config.patch_len)
        return hidden_SNE[:, :T].reshape(B, -1, T, hidden_SNE.shape[-1])


def fill_unobserved(context_BCL: torch.Tensor, stats: InstanceStats) -> torch.Tensor:
    """The context in float32 with every unobserved (non-finite) sample replaced by the last
    observed value before it, or by the window's mean before the first observed one."""
    x_BCL = context_BCL.float()
    observed_BCL = torch.isfinite(x_BCL)
    carried_BCL, last_BCL = _carried_forward(x_BCL, observed_BCL)
    return torch.where(observed_BCL, x_BCL, torch.where(last_BCL >= 0, carried_BCL, stats.mean_BC1))


def fill_short_gaps(x_BCN: torch.Tensor, limit: int) -> torch.Tensor:
    """float32 (B, C, N) with every run of at most `limit` unobserved samples between two observed
    ones filled with the last observed value before it; longer runs, and runs that touch either
    end (whose length is unknown), stay NaN. The torch twin of
    `genoformer.timeseries.baselines.fill_short_gaps` inside one window."""
    x_BCN = x_BCN.float()
    observed_BCN = torch.isfinite(x_BCN)
    N = x_BCN.shape[-1]
    carried_BCN, last_BCN = _carried_forward(x_BCN, observed_BCN)
    next_BCN = N - 1 - _last_observed(observed_BCN.flip(-1)).flip(-1)  # N where nothing follows
    short_BCN = ~observed_BCN & (last_BCN >= 0) & (next_BCN < N) & (next_BCN - last_BCN - 1 <= limit)
    return torch.where(short_BCN, carried_BCN, torch.where(observed_BCN, x_BCN, float("nan")))


def _carried_forward(x_BCN: torch.Tensor, observed_BCN: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with each sample replaced by the last observed one at or before it (x[0] where none is),
    the index of that sample (-1 where none is)), both (B, C, N)."""
    last_BCN = _last_observed(observed_BCN)
    return torch.gather(torch.where(observed_BCN, x_BCN, 0.0), -1, last_BCN.clamp(min=0)), last_BCN


def _last_observed(observed_BCN: torch.Tensor) -> torch.Tensor:
    """int64 (B, C, N): the index of the last observed sample at or before each one, -1 before the first."""
    index_N = torch.arange(observed_BCN.shape[-1], device=observed_BCN.device)
    return torch.where(observed_BCN, index_N, -1).cummax(dim=-1).values


def lag_windows(x_BCL: torch.Tensor, order: int, patch_len: int, first: int = 0) -> torch.Tensor:
    """The `order` samples before the end of each token's patch, for tokens `first`.. T - 1:
    (B, C, T - first, order), a strided view, zeros before the series' start. Patches align to
    the end (see `patchify`): token t of T ends at sample e_t = L - (T - 1 - t) * P."""
    L = x_BCL.shape[-1]
    T = math.ceil(L / patch_len)
    end0 = L - (T - 1) * patch_len
    padded_BCN = nn.functional.pad(x_BCL, (order, 0))  # sample j at j + order: e_t's lags start at e_t
    return padded_BCN[..., end0 + first * patch_len :].unfold(-1, order, patch_len)


def token_targets(context_BCL: torch.Tensor, target_BCH: torch.Tensor, patch_len: int) -> torch.Tensor:
    """What each context token of an every_token model is trained to forecast: the H samples after
    its patch, (B, C, T, H) float32. Patches align to the context's end (see `patchify`), so token t
    of T ends at sample L - (T - 1 - t) * P; the last token's target is `target_BCH` itself."""
    L, H = context_BCL.shape[-1], target_BCH.shape[-1]
    T = math.ceil(L / patch_len)
    series_BCN = torch.cat([context_BCL, target_BCH], dim=-1).float()
    windows_BCNH = series_BCN.unfold(-1, H, 1)  # window k covers samples [k, k + H)
    ends_T = torch.arange(L - (T - 1) * patch_len, L + 1, patch_len, device=series_BCN.device)
    return windows_BCNH[:, :, ends_T]


def pinball_loss(
    quantiles_BCHK: torch.Tensor,
    target_BCH: torch.Tensor,
    levels_K: torch.Tensor,
    observed_BCH: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Mean pinball (quantile) loss: max(q (y - f), (q - 1)(y - f)) averaged over everything, or
    over the targets `observed_BCH` (bool) marks."""
    diff_BCHK = target_BCH.unsqueeze(-1) - quantiles_BCHK
    loss_BCHK = torch.maximum(levels_K * diff_BCHK, (levels_K - 1.0) * diff_BCHK)
    if observed_BCH is None:
        return loss_BCHK.mean()
    mask_BCHK = observed_BCH.unsqueeze(-1).expand_as(loss_BCHK)
    return torch.where(mask_BCHK, loss_BCHK, 0.0).sum() / mask_BCHK.sum().clamp(min=1)
