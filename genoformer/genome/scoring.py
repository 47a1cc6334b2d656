"""Per-base log-likelihood of DNA under a trained model, for sequences of any length.

    scorer = Scorer.from_checkpoint("runs/genome/checkpoints/last.ckpt")
    log2p_L = scorer.log2_likelihood(codes_L, context=8192)       # (L,) float64, NaN where unscored
    bits_per_base = -np.nanmean(log2p_L)

Long sequences are cut by the one tiler (`genoformer.data.tiling`) into windows of `context`
tokens overlapping by `overlap` (default context // 2):
- a causal model scores each base from the window in which it has the most preceding context
  (`Keep.LEFT`): the first base of a sequence has no context and is not scored; every base after
  the first window sees at least `overlap` preceding bases, at most `context - 1`; a sequence that
  fits one window is scored in one untiled pass.
- a masked model scores each base from the window where it is nearest the centre
  (`Keep.CENTRE`), as a pseudo-likelihood: the window runs `mask_period` times, pass j masking the
  positions p with p % mask_period == j (p counted from the sequence start, so scores do not depend
  on the tiling) and scoring them; about 1 / mask_period of the bases are masked at a time, as in
  training.
Bases whose code is not A, C, G or T (N) are never scored. Windows are batched only with windows of
the same length, so a score never depends on what else was in the batch.

Long windows: `context` may exceed the model's max_seq_len (up to a whole record, e.g. a 4.6 Mbp
chromosome in one window on one GPU; positions past the trained context rely on RoPE
extrapolating). Memory stays linear in the window: the model runs its position-wise work in
chunks (`genoformer.core.inference.INFERENCE_CHUNK`), and the output head, its log-softmax and the
target's log2 p are computed one chunk of positions at a time on the device; only (B, W) values
come back to the host.

Shape legend: B batch of windows, W window length, V vocabulary, L sequence length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

from genoformer.core.inference import autocast
from genoformer.core.loading import LoadedModel
from genoformer.core.transformer import KVCache, Transformer
from genoformer.data.genome.alphabet import MASK, T
from genoformer.data.tiling import Keep, Tile, same_length_batches, tile_windows
from genoformer.genome.inference import LanguageModelRunner
from genoformer.hints import hint, option
from genoformer.progress import tqdm

CPU_WINDOW = 2048
"""The longest default window of every scoring command on a CPU (`scoring_window`)."""
LOG2E = 1.0 / np.log(2.0)
DEFAULT_MASK_PERIOD = 7
"""Masked models: one base in 7 masked per pass, close to the 15% of training."""


@dataclasses.dataclass(frozen=True)
class ScoringWindow:
    """The window a scoring command runs at, and a line to print about it ('' for none)."""

    length: int
    overlap: Optional[int]
    """None: the command's own default for `length` (context // 2 for evaluate and score)."""
    note: str


def scoring_window(
    trained: int,
    device: torch.device,
    window: Optional[int] = None,
    overlap: Optional[int] = None,
    *,
    name: str = "window",
) -> ScoringWindow:
    """The default window of every scoring command (`evaluate`, `score`, `variant_effect`,
    `mutagenesis`), defined here once so that a base or a variant gets the same score from each.

    Given neither `window` nor `overlap` on a CPU, a model trained at a longer context than
    CPU_WINDOW is read at CPU_WINDOW tokens with an overlap of a quarter of it (every base after
    the first window sees at least 3/4 of a window): on the 2-core CPU the shipped 256 x 8 model
    then scores about 3x faster than at an 8,192 window with half-window overlap, for about 0.001
    to 0.002 bits per base, and a variant about 40x faster than at its 32,768-base trained context
    (BENCHMARKS.md, CPU scoring speed). Otherwise (and on a GPU) the window is the trained context
    or the one given. A window longer than CPU_WINDOW on a CPU gets a note that it will be slow.
    `name` is the command's option for the window (`context` for evaluate and score).
    """
    if device.type == "cpu" and window is None and overlap is None and trained > CPU_WINDOW:
        return ScoringWindow(
            CPU_WINDOW,
            CPU_WINDOW // 4,
            f"on a CPU: {name} {CPU_WINDOW:,} (trained at {trained:,}) and overlap {CPU_WINDOW // 4:,}, "
            f"the fast default; pass {option(name, trained)} for the trained window",
        )
    length = trained if window is None else window
    note = ""
    if device.type == "cpu" and length > CPU_WINDOW:
        note = (
            f"on a CPU a {length:,}-base {name} is slow: every window is at least {length / CPU_WINDOW:.0f} times the "
            f"work of one at the CPU default of {CPU_WINDOW:,}; pass {option(name, CPU_WINDOW)} for the fast default"
        )
    return ScoringWindow(length, overlap, note)


class Scorer(LanguageModelRunner):
    """Runs a `Transformer` in eval mode and returns log2 p(base) for every base it can score."""

    def __init__(
        self,
        model: Transformer,
        *,
        context: int,
        device: Optional[Union[str, torch.device]] = None,
        autocast_dtype: Optional[torch.dtype] = None,
        mask_period: int = DEFAULT_MASK_PERIOD,
    ) -> None:
        """
        Args:
            model: the trained network (causal or masked, from `model.config.causal`).
            context: default window length in tokens: the context the model was trained with.
            device: where to run; None: CUDA when available, else CPU.
            autocast_dtype: None: bfloat16 autocast on CUDA (as in training, and as the Triton
                kernels need), float32 on the CPU.
            mask_period: masked models only: passes per window (see the module docstring).
        """
        if mask_period < 2:
            raise ValueError(f"mask_period must be at least 2, got {mask_period}.")
        if not 0 < context <= model.config.max_seq_len:
            raise ValueError(f"context must be in [1, max_seq_len={model.config.max_seq_len}], got {context}.")
        self.trained_context = context
        super().__init__(device, autocast_dtype)
        self.model = self.on_device(model)
        self.context = context
        self.mask_period = mask_period

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **options: Any) -> Scorer:
        """The default context is the one the model was trained at (options: mask_period)."""
        return cls(loaded.network, context=loaded.context, **options)

    @property
    def causal(self) -> bool:
        return self.model.config.causal

    def check_context(
        self, context: int, overlap: Optional[int], *, name: str = "context", command: Optional[str] = None
    ) -> int:
        """Validate `context` and `overlap` and let the model run windows of `context` tokens (past
        its max_seq_len too: `TransformerTrunk.reach`); returns the overlap to use.

        `name` is the caller's option that set `context` (`window` for `genoformer variant_effect`)
        and `command` the `genoformer` command whose --help the message points to, so that the
        hint names an option that exists where it is read.
        """
        if context < 2:
            see = hint("", f" (options: genoformer {command} --help)") if command else ""
            raise ValueError(
                f"{name} {context} is too short: a window holds at least 2 tokens (this model was trained at "
                f"{self.trained_context}); pass {option(name, self.trained_context)} or any length up to the longest "
                f"record{see}."
            )
        overlap = context // 2 if overlap is None else overlap
        if not 0 <= overlap < context:
            raise ValueError(f"overlap must be in [0, context={context}), got {overlap}.")
        self.model.reach(context)
        return overlap

    def log2_likelihood(
        self,
        codes_L: np.ndarray,
        *,
        context: Optional[int] = None,
        overlap: Optional[int] = None,
        batch_size: int = 8,
        progress: bool = False,
    ) -> np.ndarray:
        """log2 p(base) of one sequence of uint8 codes (L,): float64 (L,), NaN where unscored."""
        return self.score_many([codes_L], context=context, overlap=overlap, batch_size=batch_size, progress=progress)[0]

    @torch.inference_mode()
    def score_many(
        self,
        sequences: Sequence[np.ndarray],
        *,
        context: Optional[int] = None,
        overlap: Optional[int] = None,
        batch_size: int = 8,
        progress: bool = True,
        description: str = "scoring",
        spans: Optional[Sequence[Sequence[tuple[int, int]]]] = None,
    ) -> list[np.ndarray]:
        """log2 p(base) for each of several sequences (windows of equal length share batches).

        With `spans`, one list of ``(start, end)`` ranges per sequence: only the bases in them are
        scored, by the windows of the whole sequence's tiling that keep them, so they get exactly
        the scores of the whole run (the bases around a span are its context); NaN elsewhere.
        """
        context = self.context if context is None else context
        overlap = self.check_context(context, overlap)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
        keep = Keep.LEFT if self.causal else Keep.CENTRE
        results = [np.full(len(codes), np.nan) for codes in sequences]
        wanted = [np.ones(len(codes), dtype=bool) for codes in sequences]
        if spans is not None:
            for wanted_L, ranges in zip(wanted, spans, strict=True):
                wanted_L[:] = False
                for start, end in ranges:
                    wanted_L[start:end] = True
        tiles = [
            (i, tile)
            for i, codes in enumerate(sequences)
            for tile in tile_windows(len(codes), context, overlap, keep)
            if wanted[i][tile.keep_start : tile.keep_end].any()
        ]
        tiles.sort(key=lambda item: -item[1].length)  # stable: equal lengths keep input order
        passes = 1 if self.causal else self.mask_period
        with tqdm(total=len(tiles) * passes, unit="window", desc=description, disable=not progress, leave=False) as bar:
            for batch in same_length_batches(tiles, batch_size):
                tokens_BW = torch.from_numpy(np.stack([sequences[i][t.start : t.end] for i, t in batch])).long()
                if self.causal:
                    self._score_causal(tokens_BW, batch, results)
                else:
                    self._score_masked(tokens_BW, batch, results)
                bar.update(len(batch) * passes)
        for codes, result, wanted_L in zip(sequences, results, wanted):
            result[(codes > T) | ~wanted_L] = np.nan  # N (and any special token) is never a scored base
        return results

    @property
    def can_continue(self) -> bool:
        """Whether the model can continue a prefix through a key/value cache
        (`continued_log2_probabilities`): causal, with dense attention in every layer."""
        config = self.model.config
        return config.causal and all(config.pattern(i) is None for i in range(config.n_layers))

    def continued_log2_probabilities(self, prefix_GP: torch.Tensor, suffixes_BS: torch.Tensor) -> torch.Tensor:
        """log2 softmax of the logits of G prefixes (G, P) each continued by B // G suffixes (B, S),
        group g's on rows g * (B // G) ...: float32 (B, S + 1, V) on the CPU, row b's position s
        predicting the token after its prefix and s suffix tokens. One prefill of each prefix
        (a `KVCache`), its rows repeated, then one continuation: the full forward's log
        probabilities over prefix + suffix at positions P - 1 .. P + S - 1, up to float rounding."""
        G, P = prefix_GP.shape
        B, S = suffixes_BS.shape
        cache = KVCache(P + S)
        with autocast(self.device, self.autocast_dtype):
            last_GV = self.model.decode(prefix_GP.to(self.device), cache)[:, -1]
            cache.repeat_rows(B // G)
            logits_BSV = self.model.decode(suffixes_BS.to(self.device), cache)
        logits_BTV = torch.cat([last_GV.repeat_interleave(B // G, dim=0)[:, None], logits_BSV], dim=1)
        return (torch.log_softmax(logits_BTV.float(), dim=-1) * LOG2E).cpu()

    def log2_probabilities(self, tokens_BW: torch.Tensor) -> torch.Tensor:
        """log2 softmax of the model's logits for token ids (B, W): float32 (B, W, V), on the CPU
        (the head in chunks of positions, as `target_log2p`)."""
        return torch.cat(list(self._log2_softmax_chunks(tokens_BW)), dim=1)

    def target_log2p(self, inputs_BW: torch.Tensor, targets_BW: torch.Tensor) -> torch.Tensor:
        """log2 p(targets_BW[b, i]) under the model's output at position i for token ids inputs_BW
        (B, W): float64 (B, W) on the CPU. The head and its log-softmax run over chunks of
        positions on the device (the runtime's sequence_chunk), never over the whole window, and
        only the targets' values come back."""
        targets_BW1 = targets_BW.to(self.device).long().unsqueeze(-1)
        chunk = self.model.runtime.sequence_chunk or inputs_BW.shape[1]
        parts = [
            log2p_BCV.gather(-1, targets_BC1)[..., 0].cpu()
            for log2p_BCV, targets_BC1 in zip(
                self._log2_softmax_chunks(inputs_BW, on_host=False), targets_BW1.split(chunk, 1)
            )
        ]
        return torch.cat(parts, dim=1).double()

    def _log2_softmax_chunks(self, tokens_BW: torch.Tensor, on_host: bool = True) -> Iterator[torch.Tensor]:
        """float32 (B, C, V) log2 softmax of the logits of consecutive chunks of C positions (the
        runtime's sequence_chunk; the whole window without one), on the CPU or the device."""
        with autocast(self.device, self.autocast_dtype):
            hidden_BWE = self.model.hidden_state(tokens_BW.to(self.device))
        for hidden_BCE in hidden_BWE.split(self.model.runtime.sequence_chunk or tokens_BW.shape[1], 1):
            with autocast(self.device, self.autocast_dtype):
                logits_BCV = self.model.head(hidden_BCE)
            log2p_BCV = torch.log_softmax(logits_BCV.float(), dim=-1) * LOG2E
            yield log2p_BCV.cpu() if on_host else log2p_BCV

    def _score_causal(self, tokens_BW: torch.Tensor, batch: list[tuple[int, Tile]], results: list[np.ndarray]) -> None:
        # the output at window offset i predicts the token at offset i + 1 (the last predicts nothing)
        targets_BW = torch.nn.functional.pad(tokens_BW[:, 1:].clamp(max=T), (0, 1))
        log2p_BW = self.target_log2p(tokens_BW, targets_BW)[:, :-1].numpy()
        for (index, tile), log2p_W in zip(batch, log2p_BW):
            lo = max(tile.keep_start, tile.start + 1)
            results[index][lo : tile.keep_end] = log2p_W[lo - tile.start - 1 : tile.keep_end - tile.start - 1]

    def _score_masked(self, tokens_BW: torch.Tensor, batch: list[tuple[int, Tile]], results: list[np.ndarray]) -> None:
        B, W = tokens_BW.shape
        position_BW = torch.tensor([tile.start for _, tile in batch])[:, None] + torch.arange(W)[None, :]
        targets_BW = tokens_BW.clamp(max=T)
        log2p_BW = torch.empty(B, W, dtype=torch.float64)
        for phase in range(self.mask_period):
            masked_BW = position_BW % self.mask_period == phase
            inputs_BW = torch.where(masked_BW & (tokens_BW <= T), MASK, tokens_BW)
            log2p_BW = torch.where(masked_BW, self.target_log2p(inputs_BW, targets_BW), log2p_BW)
        for (index, tile), log2p_W in zip(batch, log2p_BW.numpy()):
            results[index][tile.keep_start : tile.keep_end] = log2p_W[
                tile.keep_start - tile.start : tile.keep_end - tile.start
            ]
