"""`genoformer generate`: DNA sampled base by base from a causal language model.

    generator = Generator.from_checkpoint("examples/genoformer_dna.ckpt")
    samples_ML = generator.generate(encode("ATGACC..."), length=500, temperature=0.8, seed=1, num_samples=4)
    decode(samples_ML[0])                                  # 500 bases, A C G T only

    genoformer generate --checkpoint examples/genoformer_dna.ckpt --prompt ATGACC \
        --length 500 --num_samples 4 --out samples.fasta

How. The prompt runs through the model once (the prefill), filling a `KVCache` with every
block's keys and values; each new base then costs one token's work (`Transformer.decode`)
instead of a pass over the whole prefix. Samples of one prompt are decoded together, up to
`batch_size` rows at a time, from one prefill.

On the CPU the one-token steps run on one thread (`one_cpu_thread`), the prefills on torch's
usual threads. On CUDA each one-token step is replayed as a captured CUDA graph (`GraphStep`),
whose attention is the Triton decoding kernel over the whole cache.

Context. The model reads at most `context` bases (default: the context it was trained at) to
predict the next one. A prompt longer than that is cut to its last `context` bases (and the
command says so). When the sequence outgrows the window, the window restarts on its last
`overlap` + 1 bases (default overlap: context // 2), which are prefilled again: every base after
the first window is predicted from at least overlap + 1 and at most `context` preceding bases, as
`genoformer score` reads them, and the model never sees a window longer than it was trained on.
`use_cache=False` runs the same windows through the full forward pass at every step (the
reference the cache is measured and tested against).

Sampling. Only A, C, G and T are ever drawn: the logits of N and the special tokens (PAD, MASK,
BOS) are dropped, the four left are divided by `temperature`, all but the `top_k` largest are
set aside, and a base is drawn from the softmax (top_k=1: always the likeliest base, greedy).
Sample i (0-based) of a prompt draws from its own random stream, seeded from (seed, i), so the
same seed, options and device give the same sequences, and sample i's draws do not depend on
how many samples are taken.

Shape legend: B samples decoded together, L sequence length, T prompt + generated bases,
V vocabulary, S the four bases A C G T.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from genoformer.core.checkpoints import resolve_checkpoint
from genoformer.core.inference import autocast
from genoformer.core.loading import LoadedModel
from genoformer.core.transformer import KVCache, Transformer
from genoformer.data.genome.alphabet import ALLOWED, BASES, NotDNAError, T, decode, encode
from genoformer.data.genome.inputs import read_sequences
from genoformer.data.storage import refuse_existing, write_text
from genoformer.genome.inference import LanguageModelRunner
from genoformer.hints import option
from genoformer.kernels.dispatch import Backend
from genoformer.progress import tqdm

SAMPLED_BASES = T + 1
"""Codes 0..3 (A C G T) are the only ones sampled."""
FASTA_LINE = 80
"""Bases per line of the FASTA the command writes."""


def check_sampling(temperature: float, top_k: Optional[int]) -> None:
    """ValueError naming the option and a value that works, for a bad temperature or top_k."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (math.isfinite(temperature) and temperature > 0)
    ):
        raise ValueError(
            f"temperature must be a positive number (1 samples from the model's own probabilities, below 1 "
            f"sharpens them, above 1 flattens them), got {temperature!r}; for greedy decoding (always the "
            f"likeliest base) pass {option('top_k', 1)}."
        )
    if top_k is not None and not (
        isinstance(top_k, int) and not isinstance(top_k, bool) and 1 <= top_k <= SAMPLED_BASES
    ):
        raise ValueError(
            f"top_k must be 1 to {SAMPLED_BASES} (only A, C, G and T are sampled), got {top_k!r}; "
            f"{option('top_k', 1)} is greedy, and leaving it unset samples from all four bases."
        )


def base_probabilities(logits_BV: torch.Tensor, temperature: float, top_k: Optional[int]) -> torch.Tensor:
    """Float32 (B, 4): the sampling distribution over A C G T from next-token logits (B, V): the
    other tokens dropped, divided by the temperature, all but the top_k largest (ties broken
    towards the lower code) given probability 0."""
    logits_BS = logits_BV[:, :SAMPLED_BASES].float() / temperature
    if top_k is not None and top_k < SAMPLED_BASES:
        keep_BS = torch.zeros_like(logits_BS, dtype=torch.bool)
        order_BS = logits_BS.sort(dim=-1, descending=True, stable=True).indices  # ties: the lower code first
        keep_BS.scatter_(-1, order_BS[:, :top_k], True)
        logits_BS = logits_BS.masked_fill(~keep_BS, -math.inf)
    return torch.softmax(logits_BS, dim=-1)


@contextlib.contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On the CPU, torch runs on one thread inside the block (then as before): the matrices of a
    one-token step are too small to share out, and on a busy CPU threads that wait for each
    other make each step many times slower. Elsewhere nothing changes."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sample_stream(seed: int, sample: int) -> torch.Generator:
    """The CPU random stream of sample `sample` (0-based) of a prompt under `seed`."""
    state = np.random.SeedSequence([seed, sample]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def refuse_masked(model: Transformer, what: str) -> None:
    """ValueError unless `model` is causal: a masked model cannot extend a sequence."""
    if not model.config.causal:
        raise ValueError(
            f"{what} is a masked language model, which fills in masked bases from both sides and cannot "
            "extend a sequence; generate needs a causal one (trained with objective CAUSAL_LM), such as "
            "examples/genoformer_dna.ckpt."
        )


class Generator(LanguageModelRunner):
    """Samples continuations of DNA prompts from a causal `Transformer` (see the module docstring)."""

    def __init__(
        self,
        model: Transformer,
        *,
        context: int,
        device: Optional[Union[str, torch.device]] = None,
        autocast_dtype: Optional[torch.dtype] = None,
        cuda_graphs: bool = True,
    ) -> None:
        """
        Args:
            model: a causal DNA language model with dense attention.
            context: default window in bases: the context the model was trained at.
            device: where to run; None: CUDA when available, else CPU.
            autocast_dtype: None: bfloat16 autocast on CUDA (as in training), float32 on the CPU.
            cuda_graphs: on CUDA, replay each one-token step as a captured CUDA graph (`GraphStep`);
                False launches its kernels one by one (the same numbers, more host time per base).
        """
        refuse_masked(model, "this model")
        if not 0 < context <= model.config.max_seq_len:
            raise ValueError(f"context must be in [1, max_seq_len={model.config.max_seq_len}], got {context}.")
        super().__init__(device, autocast_dtype)
        self.model = self.on_device(model)
        self.context = context
        self.cuda_graphs = cuda_graphs

    @classmethod
    def from_loaded(cls, loaded: LoadedModel, **options: Any) -> Generator:
        """The default context is the one the model was trained at; a masked model is refused
        (ValueError). Options: cuda_graphs."""
        refuse_masked(loaded.network, str(loaded.source))
        return cls(loaded.network, context=loaded.context, **options)

    def check_window(self, context: Optional[int], overlap: Optional[int]) -> tuple[int, int]:
        """(context, overlap) to use, validated; None takes the defaults."""
        max_len = self.model.config.max_seq_len
        context = self.context if context is None else context
        if not 1 <= context <= max_len:
            raise ValueError(
                f"context must be 1 to the model's max_seq_len {max_len} bases (it was trained at "
                f"{self.context}), got {context}; pass {option('context', min(self.context, max_len))} or less."
            )
        overlap = context // 2 if overlap is None else overlap
        if not 0 <= overlap < context:
            raise ValueError(
                f"overlap must be 0 to context - 1 = {context - 1} (bases kept when the window restarts), "
                f"got {overlap}; leave it unset for context // 2 = {context // 2}."
            )
        return context, overlap

    @torch.inference_mode()
    def generate(
        self,
        prompt_L: np.ndarray,
        length: int,
        *,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        seed: int = 0,
        num_samples: int = 1,
        batch_size: int = 16,
        context: Optional[int] = None,
        overlap: Optional[int] = None,
        use_cache: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        """`num_samples` continuations of one prompt: uint8 codes (num_samples, length) of A C G T.

        Args:
            prompt_L: the prompt's codes (L,) uint8 (`genoformer.data.genome.alphabet.encode`),
                at least one base; N is allowed and read as the model reads it.
            length: bases to generate after the prompt.
            temperature: divides the logits before the softmax (> 0).
            top_k: sample among the k likeliest bases (1 to 4; 1 is greedy); None: all four.
            seed: the random streams' seed (>= 0); sample i draws from stream (seed, i).
            num_samples: continuations to draw.
            batch_size: samples decoded together (the cache holds each one's keys and values).
            context: the most bases the model reads per prediction; default the trained context.
            overlap: bases kept when the window restarts; default context // 2.
            use_cache: False recomputes the whole window at every base (slow; the reference).
            progress: show a tqdm bar over the generated bases.
        """
        check_sampling(temperature, top_k)
        context, overlap = self.check_window(context, overlap)
        prompt_L = np.asarray(prompt_L)
        if prompt_L.ndim != 1 or prompt_L.size == 0:
            raise ValueError(
                f"the prompt must hold at least one base (codes of shape (L,)), got shape {prompt_L.shape}."
            )
        if prompt_L.dtype.kind not in "iu" or int(prompt_L.max()) > len(BASES) - 1 or int(prompt_L.min()) < 0:
            raise ValueError(
                "the prompt must be base codes 0..4 (A C G T N); encode it with genoformer.data.genome.alphabet.encode."
            )
        for name, value, low in (
            ("length", length, 1),
            ("num_samples", num_samples, 1),
            ("batch_size", batch_size, 1),
            ("seed", seed, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"{name} must be an integer of at least {low}, got {value!r}; pass {option(name, max(low, 1))}."
                )
        prompt_T = torch.from_numpy(prompt_L.astype(np.int64))
        samples = []
        with tqdm(total=num_samples * length, unit="base", desc="generating", disable=not progress, leave=False) as bar:
            for first in range(0, num_samples, batch_size):
                streams = [sample_stream(seed, i) for i in range(first, min(first + batch_size, num_samples))]
                samples.append(
                    self._decode_rows(prompt_T, length, streams, temperature, top_k, context, overlap, use_cache, bar)
                )
        return np.concatenate(samples)

    def _decode_rows(
        self,
        prompt_T: torch.Tensor,
        length: int,
        streams: Sequence[torch.Generator],
        temperature: float,
        top_k: Optional[int],
        context: int,
        overlap: int,
        use_cache: bool,
        bar: tqdm,
    ) -> np.ndarray:
        """One batch of samples: (B, length) codes; the window is tokens_BT[:, start:end]."""
        B, P = len(streams), len(prompt_T)
        tokens_BT = torch.empty((B, P + length), dtype=torch.long)
        tokens_BT[:, :P] = prompt_T
        tokens_BT = tokens_BT.to(self.device)
        start, end = max(0, P - context), P
        # positions the cache ever holds: the window, less the last base (drawn, never read)
        cache = KVCache(min(context, end - start + length - 1)) if use_cache else None
        logits_BV = self._window_logits(tokens_BT[:1, start:end], cache).expand(B, -1)
        if cache is not None:
            cache.repeat_rows(B)
        graph = (
            GraphStep(self.model, cache, self.autocast_dtype)
            if (cache is not None and self.cuda_graphs and self.device.type == "cuda")
            else None
        )
        for step in range(length):
            probs_BS = base_probabilities(logits_BV, temperature, top_k).cpu()
            codes_B = torch.cat([torch.multinomial(p_S, 1, generator=g) for p_S, g in zip(probs_BS, streams)])
            tokens_BT[:, end] = codes_B.to(self.device)
            end += 1
            bar.update(B)
            if step == length - 1:
                break
            if end - start > context:  # the window restarts on its last overlap + 1 bases
                start = end - overlap - 1
                logits_BV = self._window_logits(tokens_BT[:, start:end], cache)
            elif graph is not None:
                logits_BV = graph(tokens_BT[:, end - 1 : end])[:, -1]
            elif cache is not None:
                with autocast(self.device, self.autocast_dtype), one_cpu_thread(self.device):
                    logits_BV = self.model.decode(tokens_BT[:, end - 1 : end], cache)[:, -1]
            else:
                logits_BV = self._window_logits(tokens_BT[:, start:end], None)
        return tokens_BT[:, P:].to(torch.uint8).cpu().numpy()

    def _window_logits(self, tokens_BW: torch.Tensor, cache: Optional[KVCache]) -> torch.Tensor:
        """Next-base logits (B, V) after a window: prefilled into the emptied cache, or one
        full forward pass without one."""
        with autocast(self.device, self.autocast_dtype):
            if cache is None:
                return self.model(tokens_BW)[:, -1]
            cache.reset()
            return self.model.decode(tokens_BW, cache)[:, -1]


class GraphStep:
    """One-token decoding steps of `model` over `cache` replayed as one captured CUDA graph.

    A step of a small model is a few hundred kernel launches of a few microseconds each: launched
    one by one from Python, the host's time per base exceeds the GPU's. The step
    (`Transformer.decode_step`: the position is a device tensor, the cache read whole with per-row
    lengths) is captured once, on its first call, after two warm-up runs at the same position
    (they write the same slot: the cache is unchanged), and replayed for every later base. Its
    inputs are copied into static tensors (the tokens, the position = cache.length) before each
    replay; the window's restart (a new prefill into the same buffers) needs no new capture.
    Autocast runs without its weight cache inside (a cached cast would be freed between replays).
    """

    def __init__(self, model: Transformer, cache: KVCache, autocast_dtype: Optional[torch.dtype]) -> None:
        self.model, self.cache, self.autocast_dtype = model, cache, autocast_dtype
        device = next(model.parameters()).device
        self.tokens_B1 = torch.zeros((cache.batch, 1), dtype=torch.long, device=device)
        self.position_1 = torch.zeros(1, dtype=torch.long, device=device)
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.logits_B1V: Optional[torch.Tensor] = None

    def _step(self) -> torch.Tensor:
        with torch.autocast(
            "cuda",
            dtype=self.autocast_dtype or torch.float32,
            enabled=self.autocast_dtype is not None,
            cache_enabled=False,
        ):
            return self.model.decode_step(self.tokens_B1, self.cache, self.position_1)

    def __call__(self, tokens_B1: torch.Tensor) -> torch.Tensor:
        """Logits (B, 1, V) of one token per row after the cache's positions; the cache advances by one."""
        self.tokens_B1.copy_(tokens_B1)
        self.position_1.fill_(self.cache.length)
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits_B1V = self._step()
        self.graph.replay()
        self.cache.advance(1)
        return self.logits_B1V


def _prompt_codes(prompt: str) -> np.ndarray:
    """A literal --prompt as codes; ValueError naming the first bad character, 1-based."""
    try:
        codes = encode(prompt.strip())
    except NotDNAError as exc:
        raise ValueError(f"--prompt: {exc.found}; {ALLOWED}") from exc
    if codes.size == 0:
        raise ValueError("--prompt is empty; give at least one base, e.g. --prompt ATG.")
    return codes


def _fasta_record(name: str, description: str, codes: np.ndarray) -> str:
    bases = decode(codes)
    lines = [bases[i : i + FASTA_LINE] for i in range(0, len(bases), FASTA_LINE)]
    return "\n".join([f">{name} {description}", *lines]) + "\n"


def generate(
    *,
    checkpoint: Path,
    out: Path,
    length: int,
    prompt: Optional[str] = None,
    prompt_fasta: Optional[Path] = None,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    seed: int = 0,
    batch_size: int = 16,
    context: Optional[int] = None,
    overlap: Optional[int] = None,
    include_prompt: bool = False,
    device: Optional[str] = None,
    backend: Backend = Backend.AUTO,
    overwrite: bool = False,
) -> Path:
    """Sample DNA continuations of a prompt from a causal language model and write them as FASTA.

    Each base costs one token's work (a key/value cache); only A, C, G and T are sampled. The
    records are named sample_1, sample_2, ... (RECORD_sample_1, ... for a FASTA of several
    prompts), with the prompt, temperature, top_k and seed in the description; the same seed and
    options give the same sequences on the same device. The model reads at most --context bases
    per prediction: a longer prompt is cut to its last --context bases, and past the window it
    restarts on the last --overlap + 1 bases.

    Args:
        checkpoint: A causal DNA language model: genoformer-dna, a .ckpt file (`genoformer fit` or
            `export`), a run directory (its best checkpoint), RUN_DIR/best or RUN_DIR/last, an exported
            folder or a Hub id. Masked models cannot generate.
        out: The FASTA file to write (plain text, e.g. samples.fasta).
        length: Bases to generate per sample.
        prompt: The prompt as a DNA string (A C G T N, any case); give it or --prompt_fasta.
        prompt_fasta: A FASTA/GenBank file (plain, .gz, .xz, .bz2): every record is a prompt.
        num_samples: Samples per prompt.
        temperature: Divides the logits before the softmax: 1 samples from the model, below 1 is
            more conservative, above 1 more diverse; must be > 0.
        top_k: Sample among the k likeliest bases, 1 to 4 (1: greedy); default all four.
        seed: Seed of the random streams (sample_N of a prompt draws from stream (seed, N - 1)).
        batch_size: Samples decoded together (memory: a cache of 2 * layers * context * width
            numbers per sample).
        context: The most bases the model reads per prediction; default its trained context.
        overlap: Bases kept when the window restarts past --context; default context // 2.
        include_prompt: A flag: write the prompt's bases before each sample.
        device: cpu, cuda or cuda:N; default CUDA when available.
        backend: Attention backend; auto picks the fastest for the device.
        overwrite: A flag: replace an existing `out`.
    """
    out = Path(out)
    if (prompt is None) == (prompt_fasta is None):
        raise ValueError(
            "give the prompt one way: --prompt SEQUENCE (e.g. --prompt ATGAAA) or --prompt_fasta FILE "
            f"(every record a prompt){', not both' if prompt is not None else ''}."
        )
    if out.suffix.lower() in (".gz", ".xz", ".bz2"):
        raise ValueError(
            f"--out {out}: generate writes plain FASTA text; name it {out.with_suffix('')} (and compress it after)."
        )
    refuse_existing(out, overwrite)
    check_sampling(temperature, top_k)
    if prompt is not None:
        prompts = [("prompt", prompt.strip()[:60] + ("..." if len(prompt.strip()) > 60 else ""), _prompt_codes(prompt))]
    else:
        prompts = [(r.name, r.name, r.codes) for r in read_sequences([str(prompt_fasta)], flag="--prompt_fasta")]
    checkpoint = resolve_checkpoint(checkpoint)  # the file itself, for the report and titles
    generator = Generator.from_checkpoint(checkpoint, device=device, backend=Backend(backend))
    window, _ = generator.check_window(context, overlap)
    records = []
    began = time.perf_counter()
    for name, label, codes in prompts:
        if len(codes) > window:
            print(
                f"prompt {name}: {len(codes):,} bases, more than the context of {window:,}; the model reads its last {window:,}"
            )
        samples = generator.generate(
            codes,
            length,
            temperature=temperature,
            top_k=top_k,
            seed=seed,
            num_samples=num_samples,
            batch_size=batch_size,
            context=context,
            overlap=overlap,
            progress=True,
        )
        for i, sample_L in enumerate(samples, start=1):
            record = f"sample_{i}" if len(prompts) == 1 else f"{name}_sample_{i}"
            description = (
                f"prompt={label} prompt_bases={len(codes)} temperature={temperature:g} "
                f"top_k={top_k or SAMPLED_BASES} seed={seed}"
            )
            bases = np.concatenate([codes, sample_L]) if include_prompt else sample_L
            records.append(_fasta_record(record, description, bases))
    seconds = time.perf_counter() - began
    path = write_text(out, "".join(records), overwrite=overwrite)
    generated = len(records) * length
    print(f"wrote {len(records)} samples of {length:,} bases to {path} ({generated / seconds:,.0f} bases/s)")
    return path
