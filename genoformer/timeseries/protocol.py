"""The common long-horizon forecasting protocol, and the classical baselines it judges models against.

Protocol (as in the long-horizon literature: Informer, Autoformer, PatchTST, ...), per series of
n time steps:

* chronological split: train [0, n_train), validation [n_train, n - n_test), test [n - n_test, n)
  with ``n_train = int(train_fraction * n)`` and ``n_test = int(test_fraction * n)`` (0.7 and
  0.2 by default); the validation part is the rest;
* every channel z-scored with the mean and standard deviation of the training part;
* for each horizon H (96, 192, 336, 720 by default) every forecast start t in the test part whose
  whole horizon fits in it (stride 1, nothing dropped): the forecaster sees [t - lookback, t),
  which may reach back into the validation and training parts, and predicts [t, t + H);
* MSE and MAE over all those windows, steps and channels, on the z-scored values.

Missing values (NaN) are never scored and never filled in the truth: the statistics of the
training part count observed values only, a forecast step whose true value is missing is left
out of every sum, and a window none of whose target values is observed is skipped. The look-back
reaches the forecaster with its missing values as NaN: a model masks them; the baselines below
fill them (`genoformer.timeseries.baselines.fill_lookback`).

Baselines, fitted on the training part only (model choices on the validation part):

* `SeasonalNaive`: the last period repeated; the period per channel is the lag of the highest
  autocorrelation of the training part after the autocorrelation first turns negative.
* `DirectAR`: a linear autoregression of order p fitted by least squares, in the direct
  multi-horizon form (one linear map from the last p values to each of the next H values, with an
  intercept); p is chosen on the validation part, separately for each horizon. Fits and
  validation MSEs come from the window moments of `genoformer.timeseries.baselines` (windows
  with a missing value left out).
* `DLinear` (`genoformer.timeseries.baselines`): trend and remainder, one linear layer each.

Shape legend: N windows, C channels, T time steps, P look-back (order), H horizon, K quantile levels.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Optional, Union

import numpy as np
import torch

from genoformer.hints import option
from genoformer.progress import tqdm
from genoformer.timeseries.baselines import WindowMoments, fill_lookback, linear_mse, linear_problem, observed_runs

PROTOCOL_HORIZONS = (96, 192, 336, 720)
"""The horizons of the long-horizon protocol."""

Forecast = Callable[[np.ndarray, int], np.ndarray]
"""A forecaster under evaluation: (look-back windows (N, C, P) float32 z-scored, horizon H) ->
forecasts (N, C, H), or (forecasts, quantiles (N, C, H, K)) with quantile levels. The windows are
numpy arrays, or torch tensors on the evaluator's device when it is given one; the forecasts may
be either."""


@dataclasses.dataclass(frozen=True)
class ProtocolSplit:
    """The chronological split of one series of `length` steps: train [0, train_end),
    validation [train_end, test_start), test [test_start, length)."""

    length: int
    train_end: int
    test_start: int

    @classmethod
    def of(cls, length: int, train_fraction: float = 0.7, test_fraction: float = 0.2) -> ProtocolSplit:
        """n_train = int(train_fraction * n), n_test = int(test_fraction * n), validation the
        rest; every part must hold at least one step."""
        if not (0 < train_fraction < 1 and 0 < test_fraction < 1 and train_fraction + test_fraction < 1):
            raise ValueError(
                f"train_fraction={train_fraction} and test_fraction={test_fraction} must be in (0, 1) "
                "and sum to less than 1 (validation is the rest)."
            )
        n_train, n_test = int(train_fraction * length), int(test_fraction * length)
        split = cls(length, n_train, length - n_test)
        if min(split.train_end, split.test_start - split.train_end, length - split.test_start) < 1:
            raise ValueError(
                f"a series of {length} steps is too short for a {train_fraction}/{test_fraction} "
                "train/test split: one of train, validation, test would be empty."
            )
        return split

    @property
    def n_test(self) -> int:
        return self.length - self.test_start


def zscore_stats(train_CT: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (mean (C,), std (C,)) of the observed values of the training part, float64; a
    constant channel gets std 1 so that z-scoring only centres it. ValueError for a channel with
    no observed value there."""
    train_CT = np.asarray(train_CT, dtype=np.float64)
    empty = np.flatnonzero(np.isnan(train_CT).all(axis=1))
    if len(empty):
        raise ValueError(f"channel {int(empty[0])} has no observed value in the training part; a larger "
                         f"{option('train_fraction', metavar='F')} (or a store without that channel) is needed.")
    mean_C = np.nanmean(train_CT, axis=1)
    std_C = np.nanstd(train_CT, axis=1)
    return mean_C, np.where(std_C > 0, std_C, 1.0)


def check_horizons(horizons: Sequence[int], splits: Sequence[ProtocolSplit]) -> None:
    """ValueError naming the horizons that fit when some are longer than the test part of a
    series (the shortest one decides)."""
    room = min(split.n_test for split in splits)
    too_long = sorted(h for h in horizons if h > room)
    if too_long:
        fitting = sorted(h for h in horizons if h <= room) or [room]
        raise ValueError(
            f"horizon{'s' if len(too_long) > 1 else ''} {', '.join(map(str, too_long))} "
            f"{'are' if len(too_long) > 1 else 'is'} longer than the test part of the series ({room} steps "
            f"in the shortest); pass {option('horizons', fitting)} (those that fit) or a larger "
            f"{option('test_fraction', metavar='F')}."
        )


def window_starts(split: ProtocolSplit, horizon: int, lookback: int) -> range:
    """Forecast starts t of the test part whose horizon [t, t + horizon) fits in it, stride 1."""
    check_horizons([horizon], [split])
    if lookback > split.test_start:
        raise ValueError(
            f"a look-back of {lookback} steps reaches before the start of the series (the test part "
            f"starts at step {split.test_start}); use a look-back of at most {split.test_start}."
        )
    return range(split.test_start, split.length - horizon + 1)


def evaluate_protocol(
    forecast: Forecast,
    series: Sequence[np.ndarray],
    *,
    lookback: int,
    horizons: Sequence[int] = PROTOCOL_HORIZONS,
    train_fraction: float = 0.7,
    test_fraction: float = 0.2,
    batch_size: int = 256,
    progress: bool = True,
    quantile_levels: Optional[Sequence[float]] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> list[dict[str, float]]:
    """MSE and MAE of `forecast` under the protocol (module docstring) on raw series (C, T_i).

    With `quantile_levels` (K), `forecast` returns (point (N, C, H), quantiles (N, C, H, K)) and
    each row also holds "quantile_loss", the pinball loss averaged over observed values and
    levels, and "wql", the mean weighted quantile loss of GluonTS (for each level
    2 * sum pinball / sum |truth|, averaged over the levels), both on the z-scored values.

    The forecaster is called once per batch of starts with the longest horizon; shorter horizons
    score the first steps of the same forecasts (a forecast of step t + h never sees anything
    after t). Errors are summed over all series in float64, then divided by the number of
    observed target values. Each z-scored series is copied to `device` once; look-back windows
    are cut and errors summed there, so a model on that device gets its windows as torch tensors
    and its forecasts never leave it. Without `device`, the forecaster gets numpy arrays and the
    sums run on the CPU.

    Returns one row per horizon: {"horizon", "mse", "mae", "lookback", "windows", "mse_by_step",
    "missing_targets", "windows_without_targets"}: "mse_by_step" is the MSE of each forecast step
    1..horizon over all windows and channels (its mean is "mse" when no target is missing);
    "windows" counts the windows scored, "missing_targets" the target values left out as missing,
    "windows_without_targets" the windows skipped because none of their target values is observed.
    """
    horizons = sorted(int(h) for h in horizons)
    if not horizons or horizons[0] < 1:
        raise ValueError(f"horizons must be positive integers, got {horizons}.")
    check_horizons(horizons, [ProtocolSplit.of(np.shape(values)[1], train_fraction, test_fraction) for values in series])
    as_numpy = device is None
    device = torch.device("cpu" if device is None else device)
    longest = horizons[-1]
    levels_K = None if quantile_levels is None else torch.tensor(quantile_levels, dtype=torch.float64, device=device)
    sums = _ErrorSums(horizons, levels_K, device)
    for values_CT in series:
        values_CT = np.asarray(values_CT)
        split = ProtocolSplit.of(values_CT.shape[1], train_fraction, test_fraction)
        mean_C, std_C = zscore_stats(values_CT[:, : split.train_end])
        z_CT = torch.from_numpy(((values_CT - mean_C[:, None]) / std_C[:, None]).astype(np.float32)).to(device)
        starts = window_starts(split, horizons[0], lookback)
        for h in horizons:
            window_starts(split, h, lookback)  # the same checks for every horizon
        C = z_CT.shape[0]
        looks_CNP = z_CT.unfold(1, lookback, 1)  # view: window k covers [k, k + P)
        # view: the longest horizon's truth from start k, NaN (missing) past the end of the series
        truths_CNH = torch.cat([z_CT, z_CT.new_full((C, longest), math.nan)], dim=1).unfold(1, longest, 1)
        for first in tqdm(range(starts.start, starts.stop, batch_size), desc="forecast windows",
                          unit="batch", disable=not progress):
            batch = range(first, min(first + batch_size, starts.stop))
            context_NCP = looks_CNP[:, batch.start - lookback : batch.stop - lookback].permute(1, 0, 2).contiguous()
            out = forecast(context_NCP.numpy() if as_numpy else context_NCP, longest)
            pred_NCH, quant_NCHK = out if levels_K is not None else (out, None)
            pred_NCH = torch.as_tensor(pred_NCH, device=device)
            quant_NCHK = None if quant_NCHK is None else torch.as_tensor(quant_NCHK, device=device)
            if pred_NCH.shape != (len(batch), C, longest):
                raise ValueError(
                    f"the forecaster returned shape {tuple(pred_NCH.shape)} for {len(batch)} windows of "
                    f"{C} channels; expected {(len(batch), C, longest)}."
                )
            # windows of the batch whose horizon fits in the series
            fits = {h: max(0, min(batch.stop, split.length - h + 1) - batch.start) for h in horizons}
            sums.add(pred_NCH, quant_NCHK, truths_CNH[:, batch.start : batch.stop].permute(1, 0, 2), fits)
    return sums.rows(lookback)


class _ErrorSums:
    """The running error sums of every horizon, in float64 on the device where the errors are
    computed (nothing is read back before `rows`). The errors of a batch are computed once, at
    the longest horizon; horizon h sums the first h steps of the windows where it fits."""

    def __init__(self, horizons: Sequence[int], levels_K: Optional[torch.Tensor], device: torch.device) -> None:
        zeros = lambda *shape, dtype=torch.float64: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.horizons, self.levels_K = horizons, levels_K
        self.sq_H = {h: zeros(h) for h in horizons}  # squared errors summed by forecast step
        self.count_H = {h: zeros(h, dtype=torch.int64) for h in horizons}  # observed targets by forecast step
        self.abs = {h: zeros() for h in horizons}
        self.windows = {h: zeros(dtype=torch.int64) for h in horizons}  # windows with an observed target
        self.pinball_K = {h: zeros(0 if levels_K is None else len(levels_K)) for h in horizons}  # summed by level
        self.abs_truth = {h: zeros() for h in horizons}
        self.starts = dict.fromkeys(horizons, 0)  # windows seen, scored or not
        self.targets = dict.fromkeys(horizons, 0)  # their target values, observed or not

    def add(self, pred_NCH: torch.Tensor, quant_NCHK: Optional[torch.Tensor], truth_NCH: torch.Tensor,
            fits: dict[int, int]) -> None:
        """Add the errors of N windows at the longest horizon (truth NaN where missing); horizon h
        scores the first fits[h] of them."""
        observed_NCH = ~torch.isnan(truth_NCH)
        truth_NCH = torch.where(observed_NCH, truth_NCH.double(), 0.0)
        err_NCH = torch.where(observed_NCH, pred_NCH - truth_NCH, 0.0)  # float64
        sq_NH, abs_NH = err_NCH.square().sum(1), err_NCH.abs().sum(1)
        count_NH, seen_NH = observed_NCH.sum(1), observed_NCH.any(1)
        if self.levels_K is not None:
            # pinball of level q at d = truth - quantile: max(q d, (q - 1) d) = (q - 1) d + max(d, 0)
            diff_NCHK = (truth_NCH[..., None] - quant_NCHK).mul_(observed_NCH[..., None])
            diff_NHK = diff_NCHK.sum(1)
            pinball_NHK = (self.levels_K - 1.0) * diff_NHK + diff_NCHK.clamp_(min=0.0).sum(1)
            abs_truth_NH = truth_NCH.abs().sum(1)
        for h, n in fits.items():
            if n == 0:
                continue
            self.sq_H[h] += sq_NH[:n, :h].sum(0)
            self.count_H[h] += count_NH[:n, :h].sum(0)
            self.abs[h] += abs_NH[:n, :h].sum()
            self.windows[h] += seen_NH[:n, :h].any(1).sum()
            self.starts[h] += n
            self.targets[h] += n * truth_NCH.shape[1] * h
            if self.levels_K is not None:
                self.pinball_K[h] += pinball_NHK[:n, :h].sum((0, 1))
                self.abs_truth[h] += abs_truth_NH[:n, :h].sum()

    def rows(self, lookback: int) -> list[dict[str, float]]:
        """The rows of `evaluate_protocol`; ValueError for a horizon with no observed target."""
        for h in self.horizons:
            if not int(self.count_H[h].sum()):
                raise ValueError(f"no target value of the test part is observed at horizon {h}: nothing to score.")
        rows = []
        for h in self.horizons:
            count, windows = int(self.count_H[h].sum()), int(self.windows[h])
            row = {"horizon": h, "mse": float(self.sq_H[h].sum()) / count, "mae": float(self.abs[h]) / count,
                   "lookback": lookback, "windows": windows, "mse_by_step": (self.sq_H[h] / self.count_H[h]).tolist(),
                   "missing_targets": self.targets[h] - count, "windows_without_targets": self.starts[h] - windows}
            if self.levels_K is not None:
                row.update(quantile_loss=float(self.pinball_K[h].sum()) / (count * len(self.levels_K)),
                           wql=float(torch.mean(2 * self.pinball_K[h] / self.abs_truth[h])))
            rows.append(row)
        return rows


# ------------------------------------------------------------------------------------ baselines
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
        return cls([autocorrelation_period([np.asarray(p)[c] for p in train_parts], max_lag) for c in range(n_channels)])

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
        for channel_T in np.asarray(values)[:, max(0, split.train_end - order): split.test_start]:
            count += sum(max(0, end - start - order - horizon + 1) for start, end in observed_runs(channel_T))
    return count


def longest_validation_run(series: Sequence[np.ndarray], splits: Sequence[ProtocolSplit]) -> int:
    """The longest stretch of observed values inside the validation parts."""
    return max((end - start for values, split in zip(series, splits)
                for channel_T in np.asarray(values)[:, split.train_end: split.test_start]
                for start, end in observed_runs(channel_T)), default=0)


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
    def fit(cls, parts: Sequence[np.ndarray], order: int, horizon: int, ridge: float = 1e-6,
            moments: Optional[WindowMoments] = None) -> DirectAR:
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
                f"too little training data for an AR model of order {order} and horizon {horizon} "
                f"({rows} windows)."
            )
        gram[np.diag_indices(order)] += ridge * np.trace(gram[:order, :order]) / order
        solution = np.linalg.solve(gram, cross)
        return cls(solution[:order], solution[order])

    @classmethod
    def fit_select(cls, series: Sequence[np.ndarray], splits: Sequence[ProtocolSplit], horizon: int,
                   orders: Sequence[int]) -> tuple[DirectAR, dict[int, float]]:
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
        train = WindowMoments([channel_T for values, split in zip(series, splits)
                               for channel_T in np.asarray(values)[:, : split.train_end]],
                              max(tried, default=1) + horizon)
        fitted = [order for order in tried if train.count(order + horizon) > order]
        validated = [order for order in fitted if validation_windows(series, splits, order, horizon)]
        if not fitted:
            raise ValueError(
                f"no AR order in {sorted(orders)} fits in the training part ({shortest} steps, or too few fully "
                f"observed windows) with horizon {horizon}; pass shorter orders, {option('ar_orders', [8, 32])}.")
        if not validated and len(fitted) == 1:
            return cls.fit([], fitted[0], horizon, moments=train), {fitted[0]: math.nan}
        if not validated:
            room = longest_validation_run(series, splits)
            raise ValueError(
                f"pass one AR order, which needs no choosing, e.g. {option('ar_orders', [fitted[-1]])} (orders that fit "
                f"the training part: {', '.join(map(str, fitted))}), or fill the gaps: prepare the store with "
                f"{option('missing', 'linear')} (no order can be chosen on the validation part at horizon {horizon}: it "
                f"holds no fully observed window of order + {horizon} steps; its longest observed stretch is {room} "
                "steps)")
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
        moments = WindowMoments([channel_T for part_CT, first in zip(parts, firsts)
                                 for channel_T in np.asarray(part_CT, dtype=np.float64)[:, max(0, first - self.order):]],
                                span)
        problem = linear_problem(moments.moments(span), self.order)
        if problem[3] == 0:
            raise ValueError(f"no fully observed window of {span} steps (order {self.order} + horizon {self.horizon}) "
                             "to score in these parts.")
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
