"""The common long-horizon forecasting protocol that judges models and the classical baselines alike.

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

The baselines (genoformer.timeseries.baselines, one row each of its table `BASELINES`) are fitted
on the training part only (model choices on the validation part):

* `SeasonalNaive`: the last period repeated; the period per channel is the lag of the highest
  autocorrelation of the training part after the autocorrelation first turns negative.
* `DirectAR`: a linear autoregression of order p fitted by least squares, in the direct
  multi-horizon form (one linear map from the last p values to each of the next H values, with an
  intercept); p is chosen on the validation part, separately for each horizon. Fits and
  validation MSEs come from window moments (windows with a missing value left out).
* `DLinear`: trend and remainder, one linear layer each.

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
        raise ValueError(
            f"channel {int(empty[0])} has no observed value in the training part; a larger "
            f"{option('train_fraction', metavar='F')} (or a store without that channel) is needed."
        )
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
    check_horizons(
        horizons, [ProtocolSplit.of(np.shape(values)[1], train_fraction, test_fraction) for values in series]
    )
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
        for first in tqdm(
            range(starts.start, starts.stop, batch_size), desc="forecast windows", unit="batch", disable=not progress
        ):
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

    def add(
        self, pred_NCH: torch.Tensor, quant_NCHK: Optional[torch.Tensor], truth_NCH: torch.Tensor, fits: dict[int, int]
    ) -> None:
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
            row = {
                "horizon": h,
                "mse": float(self.sq_H[h].sum()) / count,
                "mae": float(self.abs[h]) / count,
                "lookback": lookback,
                "windows": windows,
                "mse_by_step": (self.sq_H[h] / self.count_H[h]).tolist(),
                "missing_targets": self.targets[h] - count,
                "windows_without_targets": self.starts[h] - windows,
            }
            if self.levels_K is not None:
                row.update(
                    quantile_loss=float(self.pinball_K[h].sum()) / (count * len(self.levels_K)),
                    wql=float(torch.mean(2 * self.pinball_K[h] / self.abs_truth[h])),
                )
            rows.append(row)
        return rows
