"""The forecasting baselines and their table: seasonal naive, AR and DLinear (`BASELINES`, one row
each, which the commands, the evaluation and the benchmarks read), and what they share: window
moments, look-back filling.

To add a baseline, write its class (a `FittedBaseline`: `lookback` and a call from look-backs to
forecasts) and its fit, and add its row to `BASELINES`: `genoformer evaluate_forecast --baseline
NAME` then scores it (docs/extending.md).

`WindowMoments` sums, over every window of `span` consecutive observed values of some series
(a window holding a missing value, NaN, is left out), the outer products w w^T, the values w and
the count. Every least-squares fit and every MSE of a linear forecaster over such windows follows
from these sums, so a baseline is fitted and validated without materialising the windows: long
runs of observed values go through one FFT (the lag products summed over the whole run) with
corrections at both ends, O(n log n + span^2) instead of O(n span^2); short runs are summed
directly. `DirectAR` and `DLinear` fit from them.

`DLinear` (Zeng et al. 2023, "Are Transformers Effective for Time Series Forecasting?"): the
look-back x (L samples) is split into a trend, its moving average over 25 samples (the ends
padded by repeating the first and last value, as the paper's code does), and the remainder; one
linear layer maps each from the look-back to the horizon and the two are added:
y = W_s (x - trend(x)) + b_s + W_t trend(x) + b_t, the layers shared by all channels (the
paper's default; `individual` gives each channel its own). The paper trains it with Adam on the
MSE and stops early on validation; here Adam runs on the exact full-batch MSE of all training
windows (computed from their window moments, so one step costs O(H L^2) however long the
series), from PyTorch's default initialisation with a fixed seed, and keeps the step with the
lowest validation MSE: deterministic, and the same objective as the paper's mini-batches. The
decomposition matters only through that optimisation: both layers together are one linear map of
the look-back, and trained to convergence DLinear would be least-squares AR of order L.

Shape legend: N windows, C channels, P look-back, H horizon, S window span, L DLinear look-back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Optional, Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from genoformer.hints import option

if TYPE_CHECKING:
    from genoformer.timeseries.protocol import ProtocolSplit

DLINEAR_KERNEL = 25
"""The moving-average kernel of DLinear's trend (the paper's)."""
DLINEAR_LOOKBACK = 336
"""DLinear's look-back: the paper's main setting (and PatchTST's), 14 days of hourly data."""


def fill_lookback(context_NCP: np.ndarray) -> np.ndarray:
    """Look-back windows with missing values (NaN) filled for forecasters that cannot mask them:
    the last observed value carried forward, 0 (the training mean of z-scored values) before the
    first one. Returns the input itself when nothing is missing."""
    missing_NCP = np.isnan(context_NCP)
    if not missing_NCP.any():
        return context_NCP
    P = context_NCP.shape[-1]
    last_NCP = np.where(missing_NCP, -1, np.arange(P))
    np.maximum.accumulate(last_NCP, axis=-1, out=last_NCP)
    filled_NCP = np.take_along_axis(context_NCP, np.maximum(last_NCP, 0), axis=-1)
    return np.where(last_NCP < 0, 0.0, filled_NCP).astype(context_NCP.dtype)


FIT_FILL_LIMIT = 32
"""Baselines are fitted on their training series with gaps of at most this many steps filled
(`fill_short_gaps`): scattered missing values would otherwise leave no window of a few hundred
steps whole."""


def fill_short_gaps(values_CT: np.ndarray, limit: int = FIT_FILL_LIMIT) -> np.ndarray:
    """A copy of the series (C, T) with every run of at most `limit` missing values filled with
    the last observed value before it (the first observed value at the start), as `fill_lookback`
    fills a look-back; longer runs stay missing."""
    out = np.array(values_CT, dtype=np.float64)
    for channel_T in out:
        missing_T = np.isnan(channel_T)
        if not missing_T.any() or missing_T.all():
            continue
        edges = np.diff(np.r_[0, missing_T.astype(np.int8), 0])
        for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            if end - start <= limit:
                channel_T[start:end] = channel_T[start - 1] if start else channel_T[end]
    return out


def observed_runs(x_T: np.ndarray) -> list[tuple[int, int]]:
    """The maximal runs [start, end) of observed (not NaN) values of a 1-D series."""
    edges = np.diff(np.r_[0, (~np.isnan(x_T)).astype(np.int8), 0])
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _lag_sums(y_R: np.ndarray, size: int) -> np.ndarray:
    """head[d, i] = sum_{m < i} y[m] y[m + d] for d, i < size (zeros past the end of y)."""
    padded = np.zeros(2 * size - 1)
    padded[: min(len(y_R), 2 * size - 1)] = y_R[: 2 * size - 1]
    shifted_DM = sliding_window_view(padded, size)  # [d, m] = y[d + m]
    products_DM = padded[:size][None, :] * shifted_DM
    head = np.zeros((size, size))
    np.cumsum(products_DM[:, :-1], axis=1, out=head[:, 1:])
    return head


class WindowMoments:
    """Sums over every fully observed window of consecutive values of some 1-D series (see the
    module docstring): ``moments(span)`` -> (sum of w w^T (S, S), sum of w (S,), count), float64.

    Args:
        parts: 1-D series (NaN for missing values); windows never cross from one to the next.
        max_span: The longest span that will be asked for.
        direct_windows: Runs holding at most this many windows of ``max_span`` are summed
            directly (a BLAS product per window block is then cheaper than the FFT's corrections).
    """

    def __init__(self, parts: Sequence[np.ndarray], max_span: int, direct_windows: int = 256) -> None:
        if max_span < 1:
            raise ValueError(f"max_span must be at least 1, got {max_span}.")
        self.max_span = max_span
        self.short: list[np.ndarray] = []
        S = max_span
        self._lag_total = np.zeros(S)  # sum over long runs of sum_m y[m] y[m + d]
        self._head = np.zeros((S, S))  # ... of the first products, head[d, i]: the i first
        self._tail = np.zeros((S, S))  # ... of the last products (the same on the reversed run)
        self._head1 = np.zeros(S + 1)  # ... of the first i values
        self._tail1 = np.zeros(S + 1)  # ... of the last r values
        self._total1 = 0.0
        self._long_count = 0
        self._long_length = 0
        for part in parts:
            x_T = np.asarray(part, dtype=np.float64)
            if x_T.ndim != 1:
                raise ValueError(f"window moments take 1-D series, got shape {x_T.shape}.")
            for start, end in observed_runs(x_T):
                run = x_T[start:end]
                if len(run) - S + 1 <= direct_windows:
                    self.short.append(run)
                    continue
                size = 1 << (len(run) + S).bit_length()
                spectrum = np.fft.rfft(run, size)
                self._lag_total += np.fft.irfft(spectrum * np.conj(spectrum), size)[:S]
                self._head += _lag_sums(run, S)
                self._tail += _lag_sums(run[::-1], S)
                self._head1[1:] += np.cumsum(run[:S])
                self._tail1[1:] += np.cumsum(run[::-1][:S])
                self._total1 += float(run.sum())
                self._long_count += 1
                self._long_length += len(run)

    def count(self, span: int) -> int:
        """The number of windows of `span` consecutive observed values."""
        return max(0, self._long_length - self._long_count * (span - 1)) + sum(
            max(0, len(run) - span + 1) for run in self.short
        )

    def moments(self, span: int, chunk: int = 8192) -> tuple[np.ndarray, np.ndarray, int]:
        """(sum of w w^T (S, S), sum of w (S,), number of windows) over every window w of `span`
        consecutive observed values."""
        S = span
        if not 1 <= S <= self.max_span:
            raise ValueError(f"span must be in [1, {self.max_span}], got {S}.")
        outer_SS = np.zeros((S, S))
        sum_S = np.zeros(S)
        count = 0
        if self._long_count:
            # window k of a run of length R covers [k, k + S), k < K = R - S + 1; entry (i, j), d = j - i:
            # sum_k y[k + i] y[k + j] = (all lag-d products) - (the i first) - (the S - 1 - j last)
            i_U, j_U = np.triu_indices(S)
            d_U = j_U - i_U
            upper = self._lag_total[d_U] - self._head[d_U, i_U] - self._tail[d_U, S - 1 - j_U]
            outer_SS[i_U, j_U] = upper
            outer_SS[j_U, i_U] = upper
            i_S = np.arange(S)
            sum_S += self._total1 - self._head1[i_S] - self._tail1[S - 1 - i_S]
            count += self._long_length - self._long_count * (S - 1)
        for run in self.short:
            if len(run) < S:
                continue
            view_NS = sliding_window_view(run, S)
            for lo in range(0, len(view_NS), chunk):
                block_NS = view_NS[lo : lo + chunk]
                outer_SS += block_NS.T @ block_NS
                sum_S += block_NS.sum(axis=0)
            count += len(view_NS)
        return outer_SS, sum_S, count


def linear_problem(moments: tuple[np.ndarray, np.ndarray, int], lags: int) -> tuple[np.ndarray, np.ndarray, float, int]:
    """From the moments of windows [lags P | targets H]: the least-squares problem of forecasting
    the targets from the lags and an intercept: (X^T X (P + 1, P + 1), X^T Y (P + 1, H), sum of
    Y^2, windows)."""
    outer_SS, sum_S, count = moments
    P = lags
    gram = np.empty((P + 1, P + 1))
    gram[:P, :P] = outer_SS[:P, :P]
    gram[:P, P] = gram[P, :P] = sum_S[:P]
    gram[P, P] = count
    cross = np.concatenate([outer_SS[:P, P:], sum_S[None, P:]], axis=0)
    return gram, cross, float(np.trace(outer_SS[P:, P:])), count


def linear_mse(weights_P1H: np.ndarray, problem: tuple[np.ndarray, np.ndarray, float, int]) -> float:
    """MSE over the windows of `problem` (from `linear_problem`) of forecasts [lags, 1] @ weights."""
    gram, cross, y_square, count = problem
    if count == 0:
        return float("nan")
    total = float(np.sum(weights_P1H * (gram @ weights_P1H))) - 2 * float(np.sum(weights_P1H * cross)) + y_square
    return max(total, 0.0) / (count * weights_P1H.shape[1])


def trend(x_LX: np.ndarray, kernel: int = DLINEAR_KERNEL) -> np.ndarray:
    """DLinear's trend of each column of x (L, X): the moving average over `kernel` samples of
    the column padded at both ends by repeating its first and last value ((kernel - 1) // 2
    each), as the paper's code does. A linear map: trend(x) = A @ x."""
    half = (kernel - 1) // 2
    padded = np.concatenate([np.repeat(x_LX[:1], half, axis=0), x_LX, np.repeat(x_LX[-1:], kernel - 1 - half, axis=0)])
    sums = np.concatenate([np.zeros((1, *x_LX.shape[1:])), np.cumsum(padded, axis=0)])
    return (sums[kernel:] - sums[:-kernel]) / kernel


def trend_transposed(g_LX: np.ndarray, kernel: int = DLINEAR_KERNEL) -> np.ndarray:
    """A^T @ g for the A of `trend` (each output sample averages `kernel` input samples, the
    ones past the ends clipped to the first and last), without forming A."""
    L, half = len(g_LX), (kernel - 1) // 2
    if L <= kernel:
        raise ValueError(f"DLinear's look-back ({L}) must be longer than its moving-average kernel ({kernel}).")
    prefix, suffix = np.cumsum(g_LX, axis=0), np.cumsum(g_LX[::-1], axis=0)[::-1]
    out = np.zeros_like(g_LX)
    for offset in range(-half, kernel - half):  # output t reads input clip(t + offset)
        if offset >= 0:
            out[offset : L - 1] += g_LX[: L - 1 - offset]
            out[L - 1] += suffix[L - 1 - offset]
        else:
            out[1 : L + offset] += g_LX[1 - offset :]
            out[0] += prefix[-offset]
    return out / kernel


@dataclasses.dataclass
class DLinear:
    """DLinear (module docstring): forecast = [x, 1] @ weights, per channel or shared."""

    weights_CP1H: np.ndarray
    """The combined linear map of each channel (one row when shared): look-back and intercept -> horizon."""
    info: dict = dataclasses.field(default_factory=dict)
    """How the fit went: steps, best step, validation MSE."""

    @property
    def lookback(self) -> int:
        return self.weights_CP1H.shape[1] - 1

    @property
    def horizon(self) -> int:
        return self.weights_CP1H.shape[2]

    @classmethod
    def fit(
        cls,
        series: Sequence[np.ndarray],
        splits: Sequence,
        *,
        horizon: int,
        lookback: int = DLINEAR_LOOKBACK,
        kernel: int = DLINEAR_KERNEL,
        individual: bool = False,
        learning_rate: float = 5e-3,
        max_steps: int = 3000,
        check_every: int = 10,
        patience: int = 20,
        seed: int = 0,
    ) -> DLinear:
        """Fit on z-scored series (C, T_i) split by their `ProtocolSplit`s: training windows lie in
        [0, train_end); validation windows are every start t in [train_end, test_start) whose
        horizon fits there, their look-back reaching back into the training part. Adam on the
        full-batch training MSE (`learning_rate`, up to `max_steps`); every `check_every` steps
        the validation MSE is measured and the best weights kept, and `patience` checks without
        improvement stop it."""
        if lookback < 1 or horizon < 1:
            raise ValueError(f"lookback ({lookback}) and horizon ({horizon}) must be >= 1.")
        span = lookback + horizon
        n_channels = np.asarray(series[0]).shape[0]
        groups = [list(range(n_channels))] if not individual else [[c] for c in range(n_channels)]
        rows, infos = [], []
        for channels in groups:
            train = [
                np.asarray(values, dtype=np.float64)[c, : split.train_end]
                for values, split in zip(series, splits)
                for c in channels
            ]
            problem = linear_problem(WindowMoments(train, span).moments(span), lookback)
            if problem[3] <= 1:
                raise ValueError(
                    f"DLinear needs training windows of {span} observed steps (look-back {lookback} + "
                    f"horizon {horizon}); the training parts hold {problem[3]}."
                )
            validation = [
                np.asarray(values, dtype=np.float64)[c, max(0, split.train_end - lookback) : split.test_start]
                for values, split in zip(series, splits)
                for c in channels
            ]
            val_problem = linear_problem(WindowMoments(validation, span).moments(span), lookback)
            weights, info = _adam_fit(
                problem,
                val_problem,
                kernel,
                learning_rate,
                max_steps,
                check_every,
                patience,
                np.random.default_rng(seed),
            )
            rows.append(weights)
            infos.append(info)
        info = infos[0] if not individual else {"channels": infos}
        return cls(np.stack(rows), {"lookback": lookback, "kernel": kernel, "individual": individual, **info})

    def __call__(self, context_NCP: np.ndarray, horizon: int) -> np.ndarray:
        if horizon > self.horizon:
            raise ValueError(f"this DLinear model was fitted for horizons up to {self.horizon}, asked for {horizon}.")
        N, C, P = context_NCP.shape
        if P < self.lookback:
            raise ValueError(f"DLinear with a look-back of {self.lookback} needs {self.lookback} samples, got {P}.")
        if self.weights_CP1H.shape[0] not in (1, C):
            raise ValueError(
                f"this DLinear model was fitted per channel on {self.weights_CP1H.shape[0]} channels, got {C}."
            )
        x_NCL = fill_lookback(context_NCP[:, :, P - self.lookback :]).astype(np.float64)
        weights_CP1H = np.broadcast_to(self.weights_CP1H, (C, *self.weights_CP1H.shape[1:]))
        out_NCH = np.einsum("ncl,clh->nch", x_NCL, weights_CP1H[:, :-1, :horizon]) + weights_CP1H[None, :, -1, :horizon]
        return out_NCH.astype(np.float32)


def _adam_fit(
    problem,
    val_problem,
    kernel: int,
    learning_rate: float,
    max_steps: int,
    check_every: int,
    patience: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, dict]:
    """DLinear's two layers trained by Adam on the quadratic full-batch MSE of `problem`; returns
    the combined weights (L + 1, H) of the step with the best validation MSE, and how it went."""
    gram, cross, _, count = problem
    L, H = gram.shape[0] - 1, cross.shape[1]
    bound = 1.0 / np.sqrt(L)  # PyTorch's nn.Linear initialisation
    params = [
        rng.uniform(-bound, bound, (L, H)),
        rng.uniform(-bound, bound, H),  # seasonal: weight^T, bias
        rng.uniform(-bound, bound, (L, H)),
        rng.uniform(-bound, bound, H),
    ]  # trend

    def combined() -> np.ndarray:  # x @ ((I - A)^T Ws + A^T Wt) + bs + bt
        return np.concatenate(
            [params[0] + trend_transposed(params[2] - params[0], kernel), (params[1] + params[3])[None]], axis=0
        )

    first_moment = [np.zeros_like(p) for p in params]
    second_moment = [np.zeros_like(p) for p in params]
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    has_validation = val_problem[3] > 0
    best_weights, best_step, best_val, since = combined(), 0, np.inf, 0
    step = 0
    for step in range(1, max_steps + 1):
        weights = combined()
        grad_P1H = 2.0 * (gram @ weights - cross) / (count * H)  # d MSE / d combined weights
        trend_grad_LH = trend(grad_P1H[:L], kernel)
        grads = [grad_P1H[:L] - trend_grad_LH, grad_P1H[L], trend_grad_LH, grad_P1H[L]]
        for k, grad in enumerate(grads):
            first_moment[k] = beta1 * first_moment[k] + (1 - beta1) * grad
            second_moment[k] = beta2 * second_moment[k] + (1 - beta2) * grad * grad
            corrected1 = first_moment[k] / (1 - beta1**step)
            corrected2 = second_moment[k] / (1 - beta2**step)
            params[k] = params[k] - learning_rate * corrected1 / (np.sqrt(corrected2) + eps)
        if step % check_every == 0 or step == max_steps:
            weights = combined()
            score = linear_mse(weights, val_problem if has_validation else problem)
            if score < best_val:
                best_weights, best_step, best_val, since = weights, step, score, 0
            else:
                since += 1
                if since >= patience:
                    break
    return best_weights, {
        "steps": step,
        "best_step": best_step,
        "train_mse": linear_mse(best_weights, problem),
        "validation_mse": best_val if has_validation else None,
        "training_windows": count,
    }


def linear_forecast(
    weights_P1H: np.ndarray, context_NCP: np.ndarray, horizon: int, order: Optional[int] = None
) -> np.ndarray:
    """[last `order` look-back values, 1] @ weights for every window and channel, float32; missing
    look-back values filled by `fill_lookback`."""
    order = weights_P1H.shape[0] - 1 if order is None else order
    N, C, P = context_NCP.shape
    lags_MP = fill_lookback(context_NCP[:, :, P - order :]).reshape(N * C, order).astype(np.float64)
    out_MH = lags_MP @ weights_P1H[:order, :horizon] + weights_P1H[order, :horizon]
    return out_MH.reshape(N, C, horizon).astype(np.float32)


# ------------------------------------------------------------------------------------ seasonal naive, AR
def autocorrelation_period(parts_T: Sequence[np.ndarray], max_lag: Optional[int] = None) -> int:
    """The dominant period of one channel: the lag of the highest autocorrelation after the
    autocorrelation first turns negative. The autocorrelation is that of the first differences
    (slow drift, such as an ECG's baseline wander, would otherwise dominate every lag), summed
    over the parts (one per series); a difference next to a missing value counts as 0. ValueError
    when it never turns negative (no period)."""
    diffs = [np.diff(np.asarray(part, dtype=np.float64)) for part in parts_T]
    diffs = [np.nan_to_num(d - np.nanmean(d)) for d in diffs if np.isfinite(d).sum() > 2]
    if not diffs:
        raise ValueError("the training part is too short to find a period; use the ar baseline.")
    longest = max(len(d) for d in diffs)
    max_lag = longest // 2 if max_lag is None else min(max_lag, longest - 1)
    acf = np.zeros(max_lag + 1)
    for d in diffs:
        size = 1 << (2 * len(d) - 1).bit_length()
        spectrum = np.fft.rfft(d, size)
        lags = np.fft.irfft(spectrum * np.conj(spectrum), size)[: min(max_lag + 1, len(d))]
        acf[: len(lags)] += lags
    if acf[0] <= 0:
        raise ValueError("the training part is constant: it has no period; use the ar baseline.")
    negative = np.flatnonzero(acf < 0)
    if len(negative) == 0:
        raise ValueError(
            f"no period found: the autocorrelation of the training part never turns negative up to lag "
            f"{max_lag}; use the ar baseline."
        )
    first = int(negative[0])
    return first + int(np.argmax(acf[first:]))


@dataclasses.dataclass
class SeasonalNaive:
    """Forecasts the last `period` values repeated; one period per channel."""

    periods: list[int]

    @classmethod
    def fit(cls, train_parts: Sequence[np.ndarray], max_lag: Optional[int] = None) -> SeasonalNaive:
        """Periods from the autocorrelation of each channel of the training parts (C, T_i)."""
        n_channels = np.asarray(train_parts[0]).shape[0]
        return cls(
            [autocorrelation_period([np.asarray(p)[c] for p in train_parts], max_lag) for c in range(n_channels)]
        )

    @property
    def lookback(self) -> int:
        return max(self.periods)

    def __call__(self, context_NCP: np.ndarray, horizon: int) -> np.ndarray:
        N, C, P = context_NCP.shape
        if C != len(self.periods):
            raise ValueError(f"the baseline was fitted on {len(self.periods)} channels, got {C}.")
        context_NCP = fill_lookback(context_NCP)
        out_NCH = np.empty((N, C, horizon), dtype=np.float32)
        for c, period in enumerate(self.periods):
            if P < period:
                raise ValueError(f"seasonal naive needs a look-back of at least one period ({period}), got {P}.")
            last_NM = context_NCP[:, c, P - period :]
            out_NCH[:, c] = np.tile(last_NM, (1, math.ceil(horizon / period)))[:, :horizon]
        return out_NCH


def validation_windows(series: Sequence[np.ndarray], splits: Sequence[ProtocolSplit], order: int, horizon: int) -> int:
    """How many forecasts an AR model of `order` can be scored on in the validation parts: starts t
    in [train_end, test_start - horizon] with [t - order, t + horizon) observed, summed over
    series and channels."""
    count = 0
    for values, split in zip(series, splits):
        for channel_T in np.asarray(values)[:, max(0, split.train_end - order) : split.test_start]:
            count += sum(max(0, end - start - order - horizon + 1) for start, end in observed_runs(channel_T))
    return count


def longest_validation_run(series: Sequence[np.ndarray], splits: Sequence[ProtocolSplit]) -> int:
    """The longest stretch of observed values inside the validation parts."""
    return max(
        (
            end - start
            for values, split in zip(series, splits)
            for channel_T in np.asarray(values)[:, split.train_end : split.test_start]
            for start, end in observed_runs(channel_T)
        ),
        default=0,
    )


@dataclasses.dataclass
class DirectAR:
    """Linear autoregression of order p, direct multi-horizon form, shared by all channels.

    forecast[t + h] = intercept[h] + sum_j coef[j, h] * x[t - p + j] for h < horizon.
    """

    coef_PH: np.ndarray
    intercept_H: np.ndarray

    @property
    def order(self) -> int:
        return self.coef_PH.shape[0]

    @property
    def horizon(self) -> int:
        return self.coef_PH.shape[1]

    lookback = order

    @classmethod
    def fit(
        cls,
        parts: Sequence[np.ndarray],
        order: int,
        horizon: int,
        ridge: float = 1e-6,
        moments: Optional[WindowMoments] = None,
    ) -> DirectAR:
        """Least squares on every fully observed (order + horizon)-step window of each series
        part (C, T), every channel alike (or on the windows of `moments`, built from those
        parts). `ridge` (relative to the mean diagonal) only keeps the solve stable."""
        if order < 1 or horizon < 1:
            raise ValueError(f"order ({order}) and horizon ({horizon}) must be >= 1.")
        span = order + horizon
        if moments is None:
            moments = WindowMoments([channel_T for part_CT in parts for channel_T in np.asarray(part_CT)], span)
        gram, cross, _, rows = linear_problem(moments.moments(span), order)
        if rows <= order:
            raise ValueError(
                f"too little training data for an AR model of order {order} and horizon {horizon} ({rows} windows)."
            )
        gram[np.diag_indices(order)] += ridge * np.trace(gram[:order, :order]) / order
        solution = np.linalg.solve(gram, cross)
        return cls(solution[:order], solution[order])

    @classmethod
    def fit_select(
        cls, series: Sequence[np.ndarray], splits: Sequence[ProtocolSplit], horizon: int, orders: Sequence[int]
    ) -> tuple[DirectAR, dict[int, float]]:
        """Fit one model per order on the training parts of the (z-scored) series (C, T_i) and keep
        the one with the lowest MSE on their validation parts: every start t in the validation
        part whose horizon fits in it, seeing [t - order, t). Returns the model and the
        validation MSE of every order tried. Orders longer than a training part, or with fewer
        fully observed training windows than coefficients, are skipped; so are orders without a
        fully observed validation window (gaps, or a validation part shorter than the horizon),
        unless no order has one: then a single order is fitted as it is (its score NaN), and
        several are an error that says to give one."""
        scores: dict[int, float] = {}
        best: Optional[DirectAR] = None
        shortest = min(split.train_end for split in splits)
        tried = [order for order in sorted(set(int(o) for o in orders)) if order + horizon <= shortest]
        train = WindowMoments(
            [
                channel_T
                for values, split in zip(series, splits)
                for channel_T in np.asarray(values)[:, : split.train_end]
            ],
            max(tried, default=1) + horizon,
        )
        fitted = [order for order in tried if train.count(order + horizon) > order]
        validated = [order for order in fitted if validation_windows(series, splits, order, horizon)]
        if not fitted:
            raise ValueError(
                f"no AR order in {sorted(orders)} fits in the training part ({shortest} steps, or too few fully "
                f"observed windows) with horizon {horizon}; pass shorter orders, {option('ar_orders', [8, 32])}."
            )
        if not validated and len(fitted) == 1:
            return cls.fit([], fitted[0], horizon, moments=train), {fitted[0]: math.nan}
        if not validated:
            room = longest_validation_run(series, splits)
            raise ValueError(
                f"pass one AR order, which needs no choosing, e.g. {option('ar_orders', [fitted[-1]])} (orders that fit "
                f"the training part: {', '.join(map(str, fitted))}), or fill the gaps: prepare the store with "
                f"{option('missing', 'linear')} (no order can be chosen on the validation part at horizon {horizon}: it "
                f"holds no fully observed window of order + {horizon} steps; its longest observed stretch is {room} "
                "steps)"
            )
        for order in validated:
            model = cls.fit([], order, horizon, moments=train)
            scores[order] = model.mse_on(
                [values[:, : split.test_start] for values, split in zip(series, splits)],
                [split.train_end for split in splits],
            )
            if best is None or scores[order] < scores[best.order]:
                best = model
        return best, scores

    def mse_on(self, parts: Sequence[np.ndarray], firsts: Sequence[int]) -> float:
        """MSE of the horizon-`self.horizon` forecasts from every start t >= first of each part
        (C, T_i) whose horizon fits in it (stride 1) and whose window is fully observed."""
        span = self.order + self.horizon
        moments = WindowMoments(
            [
                channel_T
                for part_CT, first in zip(parts, firsts)
                for channel_T in np.asarray(part_CT, dtype=np.float64)[:, max(0, first - self.order) :]
            ],
            span,
        )
        problem = linear_problem(moments.moments(span), self.order)
        if problem[3] == 0:
            raise ValueError(
                f"no fully observed window of {span} steps (order {self.order} + horizon {self.horizon}) "
                "to score in these parts."
            )
        return linear_mse(np.concatenate([self.coef_PH, self.intercept_H[None]], axis=0), problem)

    def __call__(self, context_NCP: np.ndarray, horizon: int) -> np.ndarray:
        if horizon > self.horizon:
            raise ValueError(f"this AR model was fitted for horizons up to {self.horizon}, asked for {horizon}.")
        N, C, P = context_NCP.shape
        if P < self.order:
            raise ValueError(f"an AR model of order {self.order} needs a look-back of {self.order}, got {P}.")
        lags_MP = fill_lookback(context_NCP[:, :, P - self.order :]).reshape(N * C, self.order).astype(np.float64)
        out_MH = lags_MP @ self.coef_PH[:, :horizon] + self.intercept_H[:horizon]
        return out_MH.reshape(N, C, horizon).astype(np.float32)


# ------------------------------------------------------------------------------------ the table
class FittedBaseline(Protocol):
    """A fitted baseline: forecasts (N, C, H) of z-scored values from look-backs (N, C, P), P =
    its `lookback`, missing values NaN (`fill_lookback` fills them)."""

    lookback: int

    def __call__(self, context_NCP: np.ndarray, horizon: int) -> np.ndarray: ...


DEFAULT_AR_ORDERS = (8, 32, 128, 360, 512, 720, 1024, 1536, 2048)
"""AR orders tried on the validation part (those that fit in the training part)."""


@dataclasses.dataclass(frozen=True)
class BaselineOptions:
    """The baselines' own options (the commands' --ar_orders and --dlinear_lookback)."""

    ar_orders: tuple[int, ...] = DEFAULT_AR_ORDERS
    dlinear_lookback: int = DLINEAR_LOOKBACK


Fits = tuple[list[tuple[tuple[int, ...], FittedBaseline]], dict[str, Any]]
"""What a baseline's fit gives: (horizons, the forecaster fitted for them) pairs, and what was
fitted, in the words of the results' "baseline" entry."""


@dataclasses.dataclass(frozen=True)
class Baseline:
    """One row of `BASELINES`: a classical forecaster the protocol judges models against."""

    label: str
    """Its name in tables and plots."""
    description: str
    """What it is, in a few words (the commands' --help)."""
    fit: Callable[[Sequence[np.ndarray], Sequence[ProtocolSplit], tuple[int, ...], BaselineOptions], Fits]
    """fit(series, splits, horizons, options): fitted on the training part of each (C, T) series
    (z-scored with its training statistics, gaps of up to FIT_FILL_LIMIT steps filled), model
    choices on the validation part, for the horizons to score."""


def _fit_seasonal_naive(series, splits, horizons, options) -> Fits:
    model = SeasonalNaive.fit([values[:, : split.train_end] for values, split in zip(series, splits)])
    return [(tuple(horizons), model)], {"periods": model.periods}


def _fit_ar(series, splits, horizons, options) -> Fits:
    fitted, chosen = [], {}
    for horizon in sorted(horizons):
        model, scores = DirectAR.fit_select(series, splits, horizon, options.ar_orders)
        chosen[horizon] = {
            "order": model.order,  # None: one order given, fitted without a validation window
            "validation_mse": {order: None if math.isnan(mse) else mse for order, mse in scores.items()},
        }
        fitted.append(((horizon,), model))
    return fitted, {"orders": chosen}


def _fit_dlinear(series, splits, horizons, options) -> Fits:
    fitted, fits = [], {}
    for horizon in sorted(horizons):
        model = DLinear.fit(series, splits, horizon=horizon, lookback=options.dlinear_lookback)
        fits[horizon] = model.info
        fitted.append(((horizon,), model))
    return fitted, {"fits": fits}


BASELINES: dict[str, Baseline] = {
    "seasonal_naive": Baseline(
        "seasonal naive", "last period repeated, period from the training autocorrelation", _fit_seasonal_naive
    ),
    "ar": Baseline("AR", "least-squares linear autoregression, direct multi-horizon", _fit_ar),
    "dlinear": Baseline(
        "DLinear",
        "trend and remainder, one linear layer each, Adam on the training MSE, best step on validation",
        _fit_dlinear,
    ),
}
"""Every forecasting baseline, by the name the commands take (`--baseline NAME`); the commands,
the evaluation and the benchmarks all read this table."""

BaselineName = Literal[tuple(BASELINES)]
"""The name of a row of `BASELINES`."""
