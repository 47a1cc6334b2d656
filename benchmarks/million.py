"""One GPU, a million tokens: training steps and their memory from 128k to 1M tokens and beyond, a
whole E. coli chromosome scored and embedded in one window, the small model's speed at 8k against
plain PyTorch, the scaling table, and whether the context helps (`bash benchmarks/gpu_training.sh million A|B`
runs the steps on a GPU; docs/long_context.md).

    python -m benchmarks.million --step memory --out OUT       A: training steps 128k to 1M (and 2M, 4M)
    python -m benchmarks.million --step speed --out OUT        A: the flagship at 8k and 32k, profiles
    python -m benchmarks.million --step chromosome --out OUT   B: E. coli evaluated, scored, embedded whole
    python -m benchmarks.million --step scaling --out OUT      B: tokens/s and peak memory, 8k to 1M
    python -m benchmarks.million --step context --data DIR... --out OUT   B: continue at 128k, bits/base 32k-1M
    python -m benchmarks.million --step cpu_memory --out OUT   (CPU) step memory per token per runtime
    python -m benchmarks.million --step scaling --from OUT/million_scaling.json --out OUT --plots OUT

Models: `flagship` is the shipped flagship's architecture (configs/base/genome_science_gpu.yaml:
width 256, 8 layers of 4 heads of 64), `reference` the 85M model (configs/models/reference_85m.yaml);
layouts `window_global` (configs/layouts/window_global.yaml: a 2,048-token sliding window plus the
first 128 tokens in every layer) and `dense` (causal). Runtimes: `long` is the long recipes'
(activation_checkpointing, sequence_chunk 16,384), `plain` keeps every activation (what the
genome_128k recipe runs), `compiled` the flagship's 8k recipe (compiled blocks), `graphs` compiled
blocks replaying CUDA graphs. The plain PyTorch anchors are benchmarks/train_models.py's
PlainDecoder, compiled: `sdpa` (FlashAttention-2, causal: no window) and `flex` (FlexAttention with
the same block masks). Batches are real E. coli windows; a step is a fused AdamW step under bf16
autocast. Peak memory is torch.cuda.max_memory_allocated over the timed steps; the memory a step
adds (activations and gradients) is that peak less what was allocated before it (weights,
optimizer state, layouts), per token divided by the step's tokens.

Every step works to a time budget (--budget-s): cases run most important first, the result file is
rewritten after each case (a step cut short keeps what it measured), and a case not run says why
(out of the budget, a shorter context ran out of memory, too slow by the shorter contexts' times).
The data of the context step come from `python -m benchmarks.million_data`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import yaml
from genoformer.data.genome.alphabet import reverse_complement
from genoformer.data.genome.inputs import read_sequences
from genoformer.kernels.dispatch import Backend

from benchmarks.common import (
    REPO_ROOT,
    Benchmark,
    Budget,
    Summary,
    at_least,
    block_bootstrap,
    command_line,
    describe_environment,
    error_text,
    free_memory,
    synchronize,
    table,
    verdict,
    write_result,
)
from genoformer.core.runtime import RuntimeSettings
from genoformer.core.transformer import TransformerConfig, _spec_from_dict, compile_blocks
from genoformer.genome.lm import GenoformerLM, Objective

CONFIGS = REPO_ROOT / "configs"
EXAMPLES = REPO_ROOT / "examples"
ECOLI = EXAMPLES / "ecoli_k12_mg1655.fasta.gz"
FLAGSHIP = EXAMPLES / "genoformer_dna.ckpt"
BACTERIA = ("ecoli_k12_mg1655.fasta.gz", "saureus_col.fasta.gz", "hpylori_els37.fasta.gz", "vcholerae_o395.fasta.gz")
K, M = 1 << 10, 1 << 20
COMPILER = {"cuda": "inductor", "cpu": "aot_eager"}
"""torch.compile's backend per device: on a CPU (--smoke) the graphs are captured, not generated."""
LONG_CHUNK = 16384
"""The recipes' sequence_chunk (configs/base/genome_million_gpu.yaml)."""
HELD_OUT_FRACTION = 0.05
"""The flagship's split held out the last 2% (validation) + 3% (test) of every training record."""


# ----------------------------------------------------------------------------- models and data
def architecture(name: str, smoke: bool = False) -> dict[str, int]:
    """d_model, n_layers, n_heads of `flagship` or `reference`, as the shipped configs set them."""
    if smoke:
        return {"d_model": 32, "n_layers": 2, "n_heads": 2}
    path = CONFIGS / ("base/genome_science_gpu.yaml" if name == "flagship" else "models/reference_85m.yaml")
    sizes = yaml.safe_load(path.read_text())["model"]["transformer"]
    return {key: sizes[key] for key in ("d_model", "n_layers", "n_heads")}


def layout_specs(name: str, smoke: bool = False) -> list:
    """The attention list of `window_global` (configs/layouts/window_global.yaml) or `dense`;
    --smoke shrinks the window to 64 tokens in blocks of 16."""
    if name == "dense":
        return [None]
    specs = [_spec_from_dict(spec) for spec in yaml.safe_load((CONFIGS / "layouts" / "window_global.yaml").read_text())]
    if smoke:
        from genoformer.kernels.layout import GlobalTokens, SlidingWindow, Union

        return [Union([SlidingWindow(window=64, block_size=16), GlobalTokens(1, block_size=16)])]
    return specs


def runtime_for(kind: str, device: torch.device, backend: Backend = Backend.AUTO) -> RuntimeSettings:
    """`long` (blocks recomputed, position-wise work in chunks: the recipes'), `plain` (every
    activation kept), `compiled` (the flagship's 8k recipe: compiled blocks), `graphs` (compiled
    blocks replaying CUDA graphs)."""
    chunk = LONG_CHUNK if device.type == "cuda" else 256
    return {
        "long": RuntimeSettings(attention_backend=backend, activation_checkpointing=True, sequence_chunk=chunk),
        "plain": RuntimeSettings(attention_backend=backend),
        "compiled": RuntimeSettings(attention_backend=backend, compile=True),
        "graphs": RuntimeSettings(attention_backend=backend, compile=True, cuda_graphs=True),
    }[kind]


def build_lm(
    arch: str, layout: str, context: int, runtime: RuntimeSettings, smoke: bool, weights: Optional[Path] = None
) -> GenoformerLM:
    """A causal DNA LM of `arch` with `layout`, taking windows of `context` tokens; the weights of
    `weights` when given (a layout changes no parameter: the shipped flagship's fit any layout)."""
    config = TransformerConfig(
        **architecture(arch, smoke), max_seq_len=context, rope_theta=500000.0, attention=layout_specs(layout, smoke)
    )
    torch.manual_seed(0)
    module = GenoformerLM(config, objective=Objective.CAUSAL_LM, runtime=runtime)
    if weights is not None:
        from genoformer.core.checkpoints import canonical_state_dict

        state = canonical_state_dict(torch.load(weights, map_location="cpu", weights_only=True)["state_dict"])
        module.load_state_dict({key: value.float() for key, value in state.items()})
    return module


_CODES: dict[Path, np.ndarray] = {}


def genome_codes(path: Path = ECOLI) -> np.ndarray:
    """The uint8 codes of a FASTA file's records end to end (cached): E. coli by default."""
    if path not in _CODES:
        _CODES[path] = np.concatenate([record.codes for record in read_sequences([str(path)])])
    return _CODES[path]


def windows(length: int, batch: int, seed: int = 0, codes: Optional[np.ndarray] = None) -> torch.Tensor:
    """(batch, length) uint8 windows of E. coli (or `codes`) at random starts; a window longer than
    the genome wraps around (a circular chromosome)."""
    codes = genome_codes() if codes is None else codes
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        start = int(rng.integers(len(codes)))
        rows.append(np.take(codes, np.arange(start, start + length), mode="wrap"))
    return torch.from_numpy(np.stack(rows))


# ------------------------------------------------------------------------------- measurement
def _is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


@dataclasses.dataclass
class Case:
    """One measured training step configuration."""

    name: str
    kind: str  # genoformer, sdpa or flex
    arch: str
    layout: str
    context: int
    batch: int = 1
    runtime: str = "long"  # see runtime_for (genoformer only)
    backend: Backend = Backend.AUTO
    series: str = ""  # cases of one series stop at the first that runs out of memory
    compiled: bool = True  # plain PyTorch only: torch.compile the whole model (else eager; Flex's kernel compiled)
    profiled: bool = False  # also profile a few steps after the timed ones (the same compiled model)

    @property
    def tokens(self) -> int:
        return self.context * self.batch


def plain_loss(case: Case, device: torch.device, smoke: bool) -> tuple[torch.nn.Module, Callable]:
    """The plain PyTorch anchor of `case` (benchmarks/train_models.PlainDecoder): the whole model
    compiled, or eager (Flex's kernel compiled, which it needs on a GPU). On a CPU SDPA runs its math
    backend and compiling captures graphs only (--smoke)."""
    from torch.nn.attention.flex_attention import flex_attention

    from benchmarks.train_models import PlainDecoder, sdpa_flash_only

    config = TransformerConfig(
        **architecture(case.arch, smoke),
        max_seq_len=case.context,
        vocab_size=8,
        rope_theta=500000.0,
        attention=layout_specs(case.layout, smoke),
    )
    torch.manual_seed(0)
    backend = COMPILER[device.type]
    if device.type == "cuda":
        sdpa_flash_only()
    kind = case.kind if device.type == "cuda" or case.kind == "flex" else "math"
    flex = flex_attention if case.compiled else torch.compile(flex_attention, backend=backend)
    model = PlainDecoder(config, kind, flex=flex).to(device)
    return model, torch.compile(model.loss, backend=backend) if case.compiled else model.loss


def measure_case(case: Case, device: torch.device, steps: int, smoke: bool) -> dict[str, Any]:
    """Train `steps` timed optimizer steps of `case` after one warm-up step (compiles, tunes):
    step ms (median), tokens/s, peak and step-added memory, the loss; OOM and errors recorded."""
    record: dict[str, Any] = {**dataclasses.asdict(case), "backend": Backend(case.backend).value, "tokens": case.tokens}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    began = time.perf_counter()
    model = loss_fn = optimizer = None
    try:
        free_memory(device)
        tokens_BL = windows(case.context, case.batch, seed=1).to(device)
        if case.kind == "genoformer":
            model = build_lm(
                case.arch, case.layout, case.context, runtime_for(case.runtime, device, case.backend), smoke
            ).to(device)
            model.model.apply_runtime(model.runtime)
            if model.runtime.compile:
                compile_blocks(
                    model.model,
                    backend=COMPILER[device.type],
                    mode="reduce-overhead" if model.runtime.cuda_graphs and device.type == "cuda" else None,
                )
            model.train()
            loss_fn = lambda: model.loss(tokens_BL)[0]  # noqa: E731
        else:
            model, plain = plain_loss(case, device, smoke)
            loss_fn = lambda: plain(tokens_BL)  # noqa: E731
        record["parameters"] = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")

        def step() -> float:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn()
            loss.backward()
            optimizer.step()
            return loss.detach()

        loss = step()  # warm-up: compiles, builds layouts, tunes
        synchronize(device)
        record["warmup_s"] = time.perf_counter() - began
        times = []
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            t0 = time.perf_counter()
            loss = step()
            synchronize(device)
            times.append((time.perf_counter() - t0) * 1e3)
        record.update(status="ok", step_ms=float(np.median(times)), loss=float(loss))
        record["tokens_per_s"] = case.tokens / (record["step_ms"] / 1e3)
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
            record.update(
                peak_gib=peak / 2**30, base_gib=before / 2**30, step_bytes_per_token=(peak - before) / case.tokens
            )
        if case.profiled:
            record["profile"] = profile_steps(step, device)
    except Exception as error:  # noqa: BLE001 - every failure is recorded with its cause, and the run goes on
        record["status"] = "OOM" if _is_oom(error) else f"error: {error_text(error)}"
        if not _is_oom(error):
            record["traceback"] = traceback.format_exc()[-3000:]
    finally:
        model = loss_fn = optimizer = None  # freed before the next case (the closures above read them)
        free_memory(device)
        torch._dynamo.reset()
    record["seconds"] = time.perf_counter() - began
    return record


def save(args: argparse.Namespace, data: dict) -> None:
    """Rewrite the step's result file with what it has measured so far (a step cut short by the
    call's time limit keeps it)."""
    device = getattr(args, "device", "cpu")
    write_result(args.out, BENCHMARK.result(data, args.name, describe_environment(device), command_line()))


def _left(budget: Budget) -> float:
    return budget.seconds - budget.elapsed


def run_cases(cases: list[Case], args: argparse.Namespace, data: dict, cap_s: float = math.inf) -> dict:
    """Measure `cases` in order within the budget into data["cases"], saving after each. A series
    stops at its first case that runs out of memory, or when its next case would take longer than
    `cap_s` by its shorter contexts' step times (a step's time doubles or quadruples with the context)."""
    device = torch.device(args.device)
    budget = Budget(args.budget_s)
    data.setdefault("cases", [])
    stopped: dict[str, str] = {}
    last: dict[str, list[dict]] = {}
    for case in cases:
        record: dict[str, Any]
        if case.series in stopped:
            record = {**dataclasses.asdict(case), "status": stopped[case.series]}
        elif budget.spent:
            record = {**dataclasses.asdict(case), "status": budget.skipped()}
        elif (estimate := _estimate_s(last.get(case.series, []), case, args.steps)) > min(cap_s, _left(budget)):
            record = {**dataclasses.asdict(case), "status": f"skipped: about {estimate:.0f} s by the shorter contexts"}
        else:
            print(f"{data['step']}: {case.name} ...", flush=True)
            record = measure_case(case, device, args.steps, args.smoke)
            print(
                f"{data['step']}: {case.name}: {record['status']} {record.get('step_ms', 0):.0f} ms "
                f"{record.get('peak_gib', 0):.1f} GiB",
                flush=True,
            )
            if record["status"] == "ok":
                last.setdefault(case.series, []).append(record)
            elif record["status"] == "OOM" and case.series:
                stopped[case.series] = f"skipped: {case.name} ran out of memory"
        record["backend"] = Backend(record.get("backend", Backend.AUTO)).value
        data["cases"].append(record)
        save(args, data)
    return data


def _estimate_s(done: list[dict], case: Case, steps: int) -> float:
    """Seconds a case will take (warm-up, `steps` timed steps and about a step's worth of building),
    from the step time of the series' last case scaled by the measured growth per doubling (at least
    linear in the tokens)."""
    if not done:
        return 0.0
    last = done[-1]
    growth = 2.0
    if len(done) >= 2 and done[-2]["tokens"] < last["tokens"]:
        doublings = math.log2(last["tokens"] / done[-2]["tokens"])
        growth = max(2.0, (last["step_ms"] / done[-2]["step_ms"]) ** (1 / doublings))
    doublings = math.log2(max(case.tokens / last["tokens"], 1.0))
    return last["step_ms"] / 1e3 * growth**doublings * (steps + 2)


def _lengths(smoke: bool, *contexts: int) -> list[int]:
    """The contexts, or with --smoke distinct small stand-ins (8k -> 128, 128k -> 512, 1M -> 1,440)."""
    return [16 * round(8 * (c / 8192) ** 0.5) if smoke else c for c in contexts]


# ------------------------------------------------------------------------------- step A: memory
def memory_cases(smoke: bool, longest: int) -> list[Case]:
    """Step A's training steps, most important first: the window + global layout at 128k to 1M
    (the flagship's architecture, then the 85M reference), dense causal at 256k (both), the plain
    runtime (every activation kept) at growing windows until it runs out of memory, dense causal at
    128k, then longer windows while the budget lasts."""
    lengths = _lengths(smoke, 128 * K, 256 * K, 512 * K, M)
    n128k, n256k = lengths[:2]

    def series(arch: str, layout: str, windows: list[int], runtime: str = "long") -> list[Case]:
        suffix = "" if runtime == "long" else f"-{runtime}"
        return [
            Case(
                f"{arch}-{layout}-{_tag(n)}{suffix}",
                "genoformer",
                arch,
                layout,
                n,
                runtime=runtime,
                series=f"{arch}-{layout}{suffix}",
            )
            for n in windows
        ]

    longer = [n for n in _lengths(smoke, 2 * M, 4 * M) if n <= longest]
    return (
        series("flagship", "window_global", lengths)
        + series("reference", "window_global", lengths)
        + series("flagship", "dense", [n256k])
        + series("reference", "dense", [n256k])
        + series("flagship", "window_global", lengths, runtime="plain")
        + series("flagship", "dense", [n128k])
        + series("flagship", "window_global", longer)
        + series("reference", "window_global", longer[:1])
    )


def _tag(n: int) -> str:
    return f"{n // M}M" if n % M == 0 else f"{n // K}k" if n % K == 0 else str(n)


def memory(args: argparse.Namespace) -> dict:
    if args.device.startswith("cuda"):  # the default launch configurations: tuning every one at 1M would take minutes
        os.environ.setdefault("GENOFORMER_TRITON_AUTOTUNE", "0")
    return run_cases(memory_cases(args.smoke, args.longest), args, {"step": "memory"})


# ------------------------------------------------------------------------- on the CPU: memory
CPU_MODES = {
    "plain": {},
    "sequence_chunk": {"sequence_chunk": 2048},
    "activation_checkpointing": {"activation_checkpointing": True},
    "both": {"activation_checkpointing": True, "sequence_chunk": 2048},
}
"""The runtimes the CPU memory measurement compares (chunks of 2,048 positions)."""


def _cpu_step_bytes(length: int, mode: str, n_layers: int) -> dict[str, float]:
    """In a fresh process: the resident memory one training step of the flagship's width adds
    (float32, dense causal attention on SDPA), from the kernel's peak-RSS counter, which
    /proc/self/clear_refs resets before the step."""
    torch.set_num_threads(2)
    config = TransformerConfig(
        **{**architecture("flagship"), "n_layers": n_layers}, max_seq_len=length, attention=[None]
    )
    torch.manual_seed(0)
    module = GenoformerLM(config, runtime=RuntimeSettings(attention_backend=Backend.SDPA, **CPU_MODES[mode])).train()
    tokens_BL = windows(length, 1)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS")
    began = time.perf_counter()
    loss, _ = module.loss(tokens_BL)
    loss.backward()
    seconds = time.perf_counter() - began
    return {"step_bytes": (_status_kib("VmHWM") - before) * 1024.0, "seconds": seconds, "loss": loss.item()}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}: the CPU memory measurement needs Linux")


def cpu_memory(args: argparse.Namespace) -> dict:
    """(CPU) The memory a training step adds per token, at growing lengths, for each runtime: the
    flagship's width and MLP (--layers layers, float32, dense causal attention on SDPA's CPU kernel,
    which keeps no L x L matrix), each step in a fresh process (peak resident memory of the step)."""
    import multiprocessing

    lengths = [1024, 2048] if args.smoke else args.lengths
    data = {"step": "cpu_memory", "layers": args.layers, "cases": []}
    context = multiprocessing.get_context("spawn")
    for mode in CPU_MODES:
        for length in lengths:
            with context.Pool(1) as pool:
                measured = pool.apply(_cpu_step_bytes, (length, mode, args.layers))
            record = {"mode": mode, "length": length, **measured, "bytes_per_token": measured["step_bytes"] / length}
            print(
                f"cpu_memory: {mode} {length:,}: {record['bytes_per_token']:,.0f} bytes/token "
                f"({record['seconds']:.1f} s)",
                flush=True,
            )
            data["cases"].append(record)
            save(args, data)
    return data


# --------------------------------------------------------------------------- step A: chromosome
def window_global_checkpoint(source: Path, out: Path, smoke: bool) -> Path:
    """`source` (a GenoformerLM checkpoint) with every layer on the window + global layout: the
    same weights (a layout changes no parameter), another model."""
    from genoformer.core.transformer import _spec_to_dict

    checkpoint = torch.load(source, map_location="cpu", weights_only=True)
    transformer = checkpoint["hyper_parameters"]["transformer"]
    transformer["attention"] = [_spec_to_dict(spec) for spec in layout_specs("window_global", smoke)]
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out)
    return out


def _tiny_checkpoint(out: Path) -> Path:
    """--smoke: a small causal model written as `genoformer fit` writes it (CPU, seconds)."""
    import lightning as L
    from torch.utils.data import DataLoader

    module = build_lm("flagship", "dense", 2048, RuntimeSettings(), smoke=True)
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader([{"tokens": row} for row in windows(256, 2)], batch_size=2))
    trainer.save_checkpoint(out)
    return out


@contextlib.contextmanager
def _peak(device: torch.device, record: dict) -> Iterator[None]:
    free_memory(device)
    began = time.perf_counter()
    try:
        yield
        record["status"] = "ok"
    except Exception as error:  # noqa: BLE001 - recorded with its cause
        record["status"] = "OOM" if _is_oom(error) else f"error: {error_text(error)}"
        record["traceback"] = traceback.format_exc()[-3000:]
    synchronize(device)
    record["seconds"] = time.perf_counter() - began
    if device.type == "cuda":
        record["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30


def chromosome(args: argparse.Namespace) -> dict:
    """E. coli (4.6 Mbp) in one window: `genoformer evaluate` and `score` with --context the record's
    length, `genoformer embed` with --window the record's length, as the commands run them, on the
    shipped flagship's weights with the window + global layout (dense attention over 4.6 Mbp would
    take minutes per pass); the peak memory of each."""
    with tempfile.TemporaryDirectory() as scratch:
        return _chromosome(args, Path(args.scratch) if args.scratch is not None else Path(scratch))


def _chromosome(args: argparse.Namespace, out: Path) -> dict:
    from genoformer.genome.commands import embed
    from genoformer.genome.evaluate import evaluate, score

    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    source = FLAGSHIP if not args.smoke else _tiny_checkpoint(out / "chromosome_tiny.ckpt")
    checkpoint = window_global_checkpoint(source, out / "window_global.ckpt", args.smoke)
    inputs = str(ECOLI if not args.smoke else _smoke_fasta(out))
    length = int(sum(r.codes.size for r in read_sequences([inputs])))
    # bigWig needs pyBigWig, which a GPU image may lack: the text track then (the same scores)
    track = "ecoli.bw" if importlib.util.find_spec("pyBigWig") is not None else "ecoli.bedgraph"
    data = {
        "step": "chromosome",
        "record": Path(inputs).name,
        "record_bases": length,
        "checkpoint": f"{source.name} with configs/layouts/window_global.yaml",
        "score_track": track,
        "runs": [],
    }
    device_option = {"device": args.device}
    runs = [
        (
            "evaluate",
            lambda: evaluate(
                checkpoint=checkpoint,
                inputs=[inputs],
                context=length,
                overlap=0,
                out=out / "evaluate.json",
                overwrite=True,
                **device_option,
            ),
        ),
        (
            "score",
            lambda: score(
                checkpoint=checkpoint,
                inputs=[inputs],
                context=length,
                overlap=0,
                out=out / track,
                overwrite=True,
                **device_option,
            ),
        ),
        (
            "embed",
            lambda: embed(
                checkpoint=checkpoint,
                inputs=[inputs],
                window=length,
                overlap=0,
                out=out / "ecoli.npz",
                overwrite=True,
                **device_option,
            ),
        ),
    ]
    for name, run in runs:
        record = {"command": name, "context": length}
        result = None
        with _peak(device, record):
            result = run()
        if name == "evaluate" and isinstance(result, dict):
            record.update(bits_per_base=result["total"]["bits_per_base"], bases=result["total"]["bases"])
        if name == "embed" and record["status"] == "ok":
            with np.load(out / "ecoli.npz") as stored:
                record["embedding_shape"] = list(stored["embeddings"].shape)
        print(
            f"chromosome: {name}: {record['status']} {record['seconds']:.1f} s {record.get('peak_gib', 0):.1f} GiB",
            flush=True,
        )
        data["runs"].append(record)
        save(args, data)
    return data


def _smoke_fasta(out: Path) -> Path:
    import gzip

    path = out / "smoke_record.fasta.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(">chr\n" + "".join("ACGT"[c] for c in genome_codes()[:3000]) + "\n")
    return path


# ------------------------------------------------------------------------------ step B: speed
def speed_cases(smoke: bool, flash_attn_4: bool) -> list[Case]:
    """The flagship at 8k x 16 (its stage-1 recipe's batch) and 32k x 4, most important first:
    genoformer as the recipe runs it today (compiled blocks), plain PyTorch compiled (SDPA's
    FlashAttention-2), genoformer with CUDA graphs, on flash-attn-4, at twice the batch, eager."""
    n8, n32 = _lengths(smoke, 8 * K, 32 * K)
    b8, b32 = (2, 1) if smoke else (16, 4)
    cases = [
        Case("genoformer-compiled-8k", "genoformer", "flagship", "dense", n8, b8, runtime="compiled", profiled=True),
        Case("plain-sdpa-compiled-8k", "sdpa", "flagship", "dense", n8, b8, profiled=True),
        Case("genoformer-graphs-8k", "genoformer", "flagship", "dense", n8, b8, runtime="graphs"),
    ]
    if flash_attn_4:
        cases.append(
            Case(
                "genoformer-fa4-8k",
                "genoformer",
                "flagship",
                "dense",
                n8,
                b8,
                runtime="compiled",
                backend=Backend.FLASH_ATTN_4,
            )
        )
    return cases + [
        Case("genoformer-compiled-8k-x2", "genoformer", "flagship", "dense", n8, 2 * b8, runtime="compiled"),
        Case("genoformer-eager-8k", "genoformer", "flagship", "dense", n8, b8, runtime="plain"),
        Case("genoformer-compiled-32k", "genoformer", "flagship", "dense", n32, b32, runtime="compiled", profiled=True),
        Case("plain-sdpa-compiled-32k", "sdpa", "flagship", "dense", n32, b32),
    ]


def profile_steps(step: Callable[[], object], device: torch.device, steps: int = 3) -> dict[str, Any]:
    """torch.profiler over `steps` calls of `step` (warm already): device busy time against the wall
    time (the rest: the device waits for the host), kernel launches per step, and the largest
    kernels (on a CPU: operators) by self time."""
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        began = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        wall_ms = (time.perf_counter() - began) * 1e3 / steps
    kernels = []
    for event in prof.key_averages():
        if (
            device.type == "cuda"
            and event.self_device_time_total > 0
            and event.device_type == torch.autograd.DeviceType.CUDA
        ):
            kernels.append((event.key, event.self_device_time_total / 1e3 / steps, event.count / steps))
        elif device.type != "cuda":
            kernels.append((event.key, event.self_cpu_time_total / 1e3 / steps, event.count / steps))
    kernels.sort(key=lambda item: -item[1])
    busy = sum(ms for _, ms, _ in kernels)
    return {
        "wall_ms": wall_ms,
        "busy_ms": busy,
        "idle_fraction": max(0.0, 1 - busy / wall_ms),
        "launches_per_step": sum(count for _, _, count in kernels),
        "top": [{"kernel": name[:110], "ms": ms, "calls": count} for name, ms, count in kernels[:15]],
    }


def loader_rate(smoke: bool, seconds: float = 10.0) -> dict[str, Any]:
    """Batches per second the genome data module's training loader gives (the flagship recipe's
    8k x 16 batches of random windows, 4 workers, from a store of the four bacteria built here):
    against a step's rate, whether the data can hold the GPU back."""
    from genoformer.data.genome.datamodule import GenomeDataModule

    with tempfile.TemporaryDirectory() as tmp:
        fasta = [str(EXAMPLES / name) for name in (BACTERIA[:1] if smoke else BACTERIA)]
        window, batch = (256, 2) if smoke else (8 * K, 16)
        module = GenomeDataModule(
            f"{tmp}/bacteria.zarr",
            fasta=fasta,
            window=window,
            batch_size=batch,
            num_workers=0 if smoke else 4,
            samples_per_epoch=10**6,
        )
        module.prepare_data()
        module.setup("fit")
        began, batches = None, 0
        for batch_data in module.train_dataloader():
            if began is None:  # the first batch waits for the workers to start
                began = time.perf_counter()
                continue
            batches += 1
            assert batch_data["tokens"].shape == (batch, window)
            if time.perf_counter() - began > (2.0 if smoke else seconds):
                break
        elapsed = time.perf_counter() - began
    return {
        "batches_per_s": batches / elapsed,
        "tokens_per_s": batches * batch * window / elapsed,
        "window": window,
        "batch": batch,
        "workers": 0 if smoke else 4,
    }


def speed(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    flash_attn_4 = importlib.util.find_spec("flash_attn") is not None and device.type == "cuda"
    data = {"step": "speed", "flash_attn_4": "installed" if flash_attn_4 else "not installed on this machine"}
    run_cases(speed_cases(args.smoke, flash_attn_4), args, data)
    data["loader"] = loader_rate(args.smoke)  # last: the cases matter more
    save(args, data)
    return data


# ---------------------------------------------------------------------------- step C: scaling
def scaling_cases(smoke: bool) -> list[Case]:
    """Tokens/s and peak memory at 8k, 32k, 128k and 1M, 128k tokens a step (batch 131,072 //
    context), for both models: genoformer (the long runtime) on the window + global layout, plain
    PyTorch's eager SDPA (dense causal), genoformer dense causal, then Flex on the window + global
    block masks; each series in increasing context until it runs out of memory or its shorter
    contexts say the next would take too long."""
    contexts = _lengths(smoke, 8 * K, 32 * K, 128 * K, M)
    per_step = _lengths(smoke, 128 * K)[0]
    cases = []
    for kind, layout in (
        ("genoformer", "window_global"),
        ("sdpa", "dense"),
        ("genoformer", "dense"),
        ("flex", "window_global"),
    ):  # Flex last: it compiles its kernel for every case
        for arch in ("flagship", "reference"):
            series = f"{kind}-{arch}-{layout}"
            cases += [
                Case(f"{series}-{_tag(n)}", kind, arch, layout, n, max(1, per_step // n), series=series, compiled=False)
                for n in contexts
            ]
    return cases


def scaling(args: argparse.Namespace) -> dict:
    if args.device.startswith("cuda"):
        os.environ.setdefault("GENOFORMER_TRITON_AUTOTUNE", "0")
    return run_cases(scaling_cases(args.smoke), args, {"step": "scaling"}, cap_s=args.case_cap_s)


# ------------------------------------------------------------------------ step D: the context
def _read_context_data(*paths: Path) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, int]]]:
    """The training records and the held-out sequences (codes, first held-out base) of every file."""
    train, heldout = {}, {}
    for path in paths:
        with np.load(path) as stored:
            train.update({key[len("train/") :]: stored[key] for key in stored.files if key.startswith("train/")})
            for key in stored.files:
                if key.startswith("heldout/"):
                    name, _, start = key[len("heldout/") :].rpartition("@")
                    heldout[name] = (stored[key], int(start))
    return train, heldout


def continue_training(
    module: GenoformerLM,
    train: dict[str, np.ndarray],
    context: int,
    seconds: float,
    device: torch.device,
    learning_rate: float,
    log: list,
) -> int:
    """Train `module` on random windows of `context` tokens from `train` (records weighted by
    length, half of them reverse-complemented) for `seconds`; returns the steps taken."""
    records = [codes for codes in train.values() if codes.size >= context]
    weights = np.array([codes.size for codes in records], dtype=float)
    rng = np.random.default_rng(0)
    optimizer = torch.optim.AdamW(
        module.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    module.train()
    began, step = time.perf_counter(), 0
    while time.perf_counter() - began < seconds:
        codes = records[int(rng.choice(len(records), p=weights / weights.sum()))]
        start = int(rng.integers(codes.size - context + 1))
        window = codes[start : start + context]
        window = reverse_complement(window) if rng.random() < 0.5 else window
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * min(1.0, (step + 1) / 20)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss, _ = module.loss(torch.from_numpy(np.ascontiguousarray(window))[None].to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % 25 == 1:
            log.append({"step": step, "seconds": time.perf_counter() - began, "loss_bits": loss.item() / math.log(2)})
    module.eval()
    return step


def score_heldout(scorer, heldout: dict[str, tuple[np.ndarray, int]], context: int) -> dict[str, np.ndarray]:
    """log2 p of every held-out base (from its start to the end of each sequence) at `context`
    tokens with half-window overlap, the bases before its start as context: name -> float64 array."""
    scores = {}
    for name, (codes, start) in heldout.items():
        context_here = min(context, codes.size)
        log2p = scorer.score_many(
            [codes],
            context=context_here,
            overlap=context_here // 2,
            progress=False,
            spans=[[(start, codes.size)]],
            batch_size=1,
        )[0]
        scores[name] = log2p[start:]
    return scores


def paired_gain(log2p_here: np.ndarray, log2p_base: np.ndarray, block: int) -> tuple[float, float, float]:
    """Bits per base saved here against the base context (log2 p here minus there, per base scored
    by both), with a 95% interval from resampling blocks of `block` consecutive bases
    (`benchmarks.common.block_bootstrap`: neighbouring bases' scores are not independent)."""
    both = np.isfinite(log2p_here) & np.isfinite(log2p_base)
    diff = np.where(both, log2p_here - log2p_base, 0.0)
    starts = np.arange(0, diff.size, block)
    return block_bootstrap(np.add.reduceat(diff, starts), np.maximum(np.add.reduceat(both.astype(float), starts), 0))


def context(args: argparse.Namespace) -> dict:
    """Continue the flagship (window + global layout) at --train_context for --train_s seconds, then
    bits per base of the held-out sequences at each of --contexts, for the continued model and for the
    flagship's weights with the same layout before continuing; gains over the shortest context with
    block-bootstrap intervals. Whatever the budget leaves undone is said."""
    from genoformer.core.inference import INFERENCE_CHUNK
    from genoformer.genome.scoring import Scorer

    device = torch.device(args.device)
    train, heldout = _read_context_data(*(Path(folder) / "context_data.npz" for folder in args.data))
    if args.smoke:
        heldout = {
            name: (codes[max(0, start - 2000) : start + 500], min(start, 2000))
            for name, (codes, start) in list(heldout.items())[:2]
        }
    budget = Budget(args.budget_s)
    data = {
        "step": "context",
        "train_context": args.train_context,
        "contexts": args.contexts,
        "log": [],
        "models": {},
        "heldout_bases": {name: int(codes.size - start) for name, (codes, start) in heldout.items()},
    }
    weights = None if args.smoke else FLAGSHIP
    module = build_lm(
        "flagship", "window_global", max(args.contexts), runtime_for("long", device), args.smoke, weights
    ).to(device)
    module.model.apply_runtime(module.runtime)
    chunk = INFERENCE_CHUNK if not args.smoke else 256
    for label in ("flagship (window + global, not continued)", "continued"):
        if label == "continued":
            train_s = max(0.0, min(args.train_s, _left(budget) - args.score_reserve_s))
            steps = continue_training(
                module, train, args.train_context, train_s, device, args.learning_rate, data["log"]
            )
            data.update(train_steps=steps, train_seconds=train_s, train_tokens=steps * args.train_context)
        scorer = Scorer(module.model, context=args.train_context, device=device)
        scorer.model.runtime.activation_checkpointing = False
        scorer.model.runtime.sequence_chunk = chunk
        results = {}
        for n in sorted(args.contexts):
            if budget.spent and not args.smoke:
                results[str(n)] = {"status": budget.skipped()}
                continue
            began = time.perf_counter()
            with torch.inference_mode():
                scores = score_heldout(scorer, heldout, n)
            results[str(n)] = {"seconds": time.perf_counter() - began, "scores": scores}
        data["models"][label] = _context_table(results, args.contexts)
        module.model.apply_runtime(runtime_for("long", device))
        save(args, data)
    return data


def _context_table(results: dict, contexts: list[int]) -> dict:
    """Per context: bits per base of each kind of held-out DNA, and the gain over the shortest
    context (bits at the shortest minus bits here: positive is better) with its interval."""
    shortest = str(min(contexts))
    table = {}
    for n, result in results.items():
        if "scores" not in result:
            table[n] = result
            continue
        row = {"seconds": result["seconds"]}
        for kind in ("bacterial", "eukaryotic"):
            names = [name for name in result["scores"] if name.startswith(kind)]
            if not names:
                continue
            here = np.concatenate([result["scores"][name] for name in names])
            row[kind] = {"bits_per_base": float(-np.nanmean(here)), "bases": int(np.isfinite(here).sum())}
            if n != shortest and "scores" in results.get(shortest, {}):
                base = np.concatenate([results[shortest]["scores"][name] for name in names])
                gain, low, high = paired_gain(here, base, block=10_000 if here.size > 100_000 else 100)
                row[kind]["gain_over_shortest"] = {"bits": gain, "low": low, "high": high}
        table[n] = row
    return table


# --------------------------------------------------------------------------------- summaries
def _ran(case: dict) -> bool:
    return case.get("status") == "ok" or case.get("status") == "OOM" or str(case.get("status", "")).startswith("error")


def _skipped_note(cases: list[dict]) -> list[str]:
    skipped = [c for c in cases if not _ran(c)]
    if not skipped:
        return []
    reasons: dict[str, list[str]] = {}
    for c in skipped:
        reasons.setdefault(c["status"], []).append(c["name"])
    return [f"Not run ({reason}): {', '.join(names)}." for reason, names in reasons.items()]


def case_rows(cases: list[dict]) -> list[dict]:
    """One row per case that ran (OOM and errors too)."""
    rows = []
    for c in cases:
        if not _ran(c):
            continue
        ok = c["status"] == "ok"
        runtime = (
            c.get("runtime", "")
            if c.get("kind") == "genoformer"  # plain PyTorch: the whole model compiled or not
            else "compiled"
            if c.get("compiled", True)
            else "eager"
        )
        rows.append(
            {
                "case": c["name"],
                "tokens": f"{c['context']:,} x {c.get('batch', 1)}",
                "runtime": runtime,
                "step ms": c.get("step_ms") if ok else None,
                "tokens/s": round(c["tokens_per_s"]) if ok else None,
                "peak GiB": c.get("peak_gib") if ok else None,
                "step bytes/token": round(c["step_bytes_per_token"]) if ok and "step_bytes_per_token" in c else None,
                "status": "" if ok else c["status"],
            }
        )
    return rows


def memory_targets(cases: list[dict]) -> list[dict]:
    """The memory targets (1M-token steps, flat memory per token, dense causal at 256k) from the memory step's cases."""

    def ok(name: str) -> Optional[dict]:
        return next((c for c in cases if c["name"] == name and c.get("status") == "ok"), None)

    rows = []
    for arch in ("flagship", "reference"):
        one = ok(f"{arch}-window_global-1M")
        rows.append(
            verdict(
                f"a 1M-token training step, {arch} (window + global)",
                f"{one['step_ms'] / 1e3:.1f} s, {one['peak_gib']:.1f} GiB" if one else "no step ran",
                True
                if one
                else None
                if not any(c["name"] == f"{arch}-window_global-1M" and _ran(c) for c in cases)
                else False,
            )
        )
        per_token = [
            c["step_bytes_per_token"]
            for n in (128 * K, 256 * K, 512 * K, M)
            if (c := ok(f"{arch}-window_global-{_tag(n)}")) and "step_bytes_per_token" in c
        ]
        spread = max(per_token) / min(per_token) if len(per_token) == 4 else None
        rows.append(at_most_ratio(f"step memory per token from 128k to 1M within 1.2x, {arch}", spread, per_token))
    dense = [c for c in cases if c["layout"] == "dense" and c.get("status") == "ok" and c["context"] >= 256 * K]
    rows.append(
        verdict(
            "dense causal trains at 256k or more",
            "; ".join(f"{c['name']}: {c['step_ms'] / 1e3:.1f} s, {c['peak_gib']:.1f} GiB" for c in dense)
            or "no step ran",
            True if dense else None,
        )
    )
    return rows


def at_most_ratio(target: str, spread: Optional[float], values: list[float]) -> dict:
    measured = (
        f"{spread:.2f}x ({min(values):,.0f} to {max(values):,.0f} bytes per token)"
        if spread is not None
        else f"{len(values)} of the 4 lengths measured"
    )
    return verdict(target, measured, None if spread is None else spread <= 1.2)


def scaling_table(cases: list[dict]) -> dict:
    """One row per series, one column per context: tokens/s and peak GiB, or why not."""
    contexts = sorted({c["context"] for c in cases})
    rows = []
    for series in dict.fromkeys(c["series"] for c in cases):
        row: dict[str, Any] = {"series": series}
        for c in cases:
            if c["series"] == series:
                row[_tag(c["context"])] = (
                    f"{c['tokens_per_s']:,.0f} tok/s, {c['peak_gib']:.1f} GiB"
                    if c.get("status") == "ok" and "peak_gib" in c
                    else f"{c['tokens_per_s']:,.0f} tok/s"
                    if c.get("status") == "ok"
                    else "OOM"
                    if c.get("status") == "OOM"
                    else "error"
                    if str(c.get("status")).startswith("error")
                    else "-"
                )
        rows.append(row)
    return table(
        rows,
        "Tokens per second and peak memory (128k tokens a step: batch 131,072 // context); "
        "'-' not run (see the notes); errors in the result file",
        ["series", *[_tag(n) for n in contexts]],
    )


def summarize(data: dict) -> Summary:
    step = data["step"]
    summary = Summary(title=TITLES[step])
    if step in ("memory", "speed", "scaling"):
        cases = data["cases"]
        if step == "scaling":
            summary.tables.append(scaling_table(cases))
            summary.notes.append(
                "Plot: benchmarks/results/million_scaling.png (python -m benchmarks.million --step "
                "scaling --from RESULT --out OUT --plots OUT)."
            )
        else:
            summary.tables.append(table(case_rows(cases)))
        summary.notes += _skipped_note(cases)
    if step == "memory":
        summary.targets += memory_targets(data["cases"])
    if step == "speed":
        _speed_summary(data, summary)
    if step == "chromosome":
        rows = [
            {
                "command": r["command"],
                "window (bases)": r["context"],
                "seconds": r.get("seconds"),
                "peak GiB": r.get("peak_gib"),
                "bits/base": r.get("bits_per_base"),
                "embedding": "x".join(map(str, r["embedding_shape"])) if "embedding_shape" in r else "",
                "status": r["status"],
            }
            for r in data["runs"]
        ]
        summary.tables.append(table(rows, f"{data['record_bases']:,} bases in one window: {data['checkpoint']}"))
        ran = {r["command"]: r["status"] == "ok" for r in data["runs"]}
        whole = data.get("record") == ECOLI.name  # a smoke run's record is a stand-in
        summary.targets.append(
            verdict(
                "the whole E. coli chromosome (4,641,652 bases) evaluated, scored and embedded in one window",
                ", ".join(f"{r['command']}: {r['status']}" for r in data["runs"]),
                all(ran.get(name) for name in ("evaluate", "score", "embed")) if whole else None,
            )
        )
    if step == "cpu_memory":
        rows = [
            {
                "runtime": c["mode"],
                "length": c["length"],
                "step bytes/token": round(c["bytes_per_token"]),
                "seconds": c["seconds"],
            }
            for c in data["cases"]
        ]
        summary.tables.append(
            table(
                rows,
                f"A training step of the flagship's width, {data['layers']} layers, float32, on the "
                "CPU: the resident memory it adds, per token",
            )
        )
    if step == "context":
        _context_summary(data, summary)
    return summary


def _speed_summary(data: dict, summary: Summary) -> None:
    cases = {c["name"]: c for c in data["cases"] if c.get("status") == "ok"}
    today, plain = cases.get("genoformer-compiled-8k"), cases.get("plain-sdpa-compiled-8k")
    at_8k = [c for c in cases.values() if c["kind"] == "genoformer" and c["context"] == (today or {}).get("context")]
    best = max(at_8k, key=lambda c: c["tokens_per_s"]) if at_8k else None
    summary.targets.append(
        at_least(
            "flagship at 8k: at least 2x the tokens/s of the recipe's settings today (same run)",
            best and today and best["tokens_per_s"] / today["tokens_per_s"],
            2.0,
            "x",
            None
            if not best
            else f"{best['tokens_per_s'] / today['tokens_per_s']:.2f}x ({best['name']} against genoformer-compiled-8k)",
        )
    )
    summary.targets.append(
        at_least(
            "flagship at 8k: at least 1.3x plain PyTorch with compiled SDPA",
            best and plain and best["tokens_per_s"] / plain["tokens_per_s"],
            1.3,
            "x",
            None
            if not (best and plain)
            else f"{best['tokens_per_s'] / plain['tokens_per_s']:.2f}x ({best['name']} against plain-sdpa-compiled-8k)",
        )
    )
    same = [c for c in at_8k if today and c["batch"] == today["batch"] and c is not today and "loss" in c]
    drift = max((abs(c["loss"] - today["loss"]) for c in same), default=None)
    summary.targets.append(
        verdict(
            "the faster runtimes train the same model: their loss after the same steps on the same "
            "batch within 0.01 nats of the recipe's",
            "no runtime to compare"
            if drift is None
            else f"{drift:.4f} nats at most ({', '.join(c['name'] for c in same)})",
            None if drift is None else drift <= 0.01,
        )
    )
    summary.notes.append(f"flash-attn-4: {data.get('flash_attn_4')}.")
    loader = data.get("loader")
    if loader:
        summary.notes.append(
            f"Data: the genome data module's training loader ({loader['workers']} workers, {loader['batch']} x "
            f"{loader['window']:,} windows of the four bacteria) gave {loader['tokens_per_s']:,.0f} tokens/s."
        )
    for case in data["cases"]:
        profile = case.get("profile")
        if profile is None:
            continue
        summary.notes.append(
            f"Profile of {case['name']}: {profile['busy_ms']:.1f} ms of device time in "
            f"{profile['wall_ms']:.1f} ms of wall time per step ({profile['idle_fraction']:.0%} idle), "
            f"{profile['launches_per_step']:.0f} launches per step."
        )
        summary.tables.append(
            table(
                [
                    {"kernel": t["kernel"], "ms per step": t["ms"], "calls": round(t["calls"])}
                    for t in profile["top"][:10]
                ],
                f"The largest kernels of {case['name']}",
                headline=False,
            )
        )


def _context_summary(data: dict, summary: Summary) -> None:
    summary.notes.append(
        f"Continued at {data['train_context']:,} tokens from the shipped flagship's weights with the window "
        f"+ global layout: {data.get('train_steps', 0):,} steps ({data.get('train_tokens', 0) / 1e6:.0f} M "
        f"tokens, {data.get('train_seconds', 0):.0f} s). Gains are over the shortest context "
        "(positive: fewer bits), 95% intervals from 10 kb blocks."
    )
    summary.notes.append("Plot: benchmarks/results/million_context.png (--plots).")
    held = data.get("heldout_bases", {})
    if held and not any(name.startswith("eukaryotic") for name in held):
        summary.notes.append(
            "No eukaryotic held-out DNA in this run (python -m benchmarks.million_data --no_bacteria "
            "on the CPU machine writes it; carry .device)."
        )
    rows = []
    for label, per_context in data["models"].items():
        for n, row in per_context.items():
            if "status" in row:
                rows.append({"model": label, "context": int(n), "bits/base": row["status"]})
            for kind in ("bacterial", "eukaryotic"):
                if kind in row:
                    gain = row[kind].get("gain_over_shortest")
                    rows.append(
                        {
                            "model": label,
                            "held-out DNA": kind,
                            "context": int(n),
                            "bits/base": round(row[kind]["bits_per_base"], 4),
                            "bases": row[kind]["bases"],
                            "gain (95% CI)": ""
                            if gain is None
                            else f"{gain['bits']:+.4f} ({gain['low']:+.4f}, {gain['high']:+.4f})",
                        }
                    )
    summary.tables.append(table(rows, "Bits per base on held-out DNA at each context"))
    longest = max(data["contexts"])
    row = data["models"].get("continued", {}).get(str(longest), {})
    gains = {
        kind: row[kind]["gain_over_shortest"]
        for kind in ("bacterial", "eukaryotic")
        if "gain_over_shortest" in row.get(kind, {})
    }
    measured = "; ".join(
        f"{kind}: {g['bits']:+.4f} bits/base ({g['low']:+.4f}, {g['high']:+.4f})" for kind, g in gains.items()
    )
    summary.targets.append(
        verdict(
            f"the continued model at {longest:,} tokens of context against {min(data['contexts']):,}, "
            "with 95% intervals, on held-out bacterial and eukaryotic DNA",
            measured or row.get("status", "not scored"),
            True if len(gains) == 2 else None,
        )
    )


# ------------------------------------------------------------------------------------ plots
def plots(data: dict, folder: Path) -> list[Path]:
    """The figures of a step's data in `folder`: million_scaling.png, million_context.png."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if data["step"] == "scaling":
        fig = Figure(figsize=(11, 4.2))
        FigureCanvasAgg(fig)
        speed_ax, memory_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        for series in dict.fromkeys(c["series"] for c in data["cases"]):
            done = [c for c in data["cases"] if c["series"] == series and c.get("status") == "ok"]
            style = "-" if series.startswith("genoformer") else "--"
            if done:
                speed_ax.plot(
                    [c["context"] for c in done], [c["tokens_per_s"] for c in done], style, marker="o", label=series
                )
            if measured := [c for c in done if "peak_gib" in c]:  # (GPU runs only)
                memory_ax.plot([c["context"] for c in measured], [c["peak_gib"] for c in measured], style, marker="o")
        for ax, label in ((speed_ax, "tokens per second"), (memory_ax, "peak memory (GiB)")):
            ax.set_xscale("log", base=2)
            if ax.has_data():
                ax.set_yscale("log")
            ax.set_xlabel("context (tokens)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        speed_ax.legend(fontsize=7)
        fig.tight_layout()
        written.append(folder / "million_scaling.png")
        fig.savefig(written[-1], dpi=100)
    if data["step"] == "context":
        fig = Figure(figsize=(6.5, 4.2))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for label, per_context in data["models"].items():
            for kind in ("bacterial", "eukaryotic"):
                points = [
                    (int(n), row[kind].get("gain_over_shortest", {"bits": 0.0, "low": 0.0, "high": 0.0}))
                    for n, row in per_context.items()
                    if kind in row
                ]
                if points:
                    ys = [g["bits"] for _, g in points]
                    errors = [
                        [y - g["low"] for (_, g), y in zip(points, ys)],
                        [g["high"] - y for (_, g), y in zip(points, ys)],
                    ]
                    ax.errorbar(
                        [n for n, _ in points], ys, yerr=errors, marker="o", capsize=3, label=f"{label}, {kind}"
                    )
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("bits per base saved over the shortest context")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        written.append(folder / "million_context.png")
        fig.savefig(written[-1], dpi=100)
    return written


# --------------------------------------------------------------------------------------- main
TITLES = {
    "memory": "One GPU, a million tokens: training steps and their memory",
    "chromosome": "One GPU, a million tokens: a whole chromosome in one window",
    "speed": "The flagship at full speed: 8k and 32k against plain PyTorch",
    "scaling": "One GPU, a million tokens: tokens per second and memory against context",
    "context": "Does the context help? Bits per base at 32k, 128k and 1M",
    "cpu_memory": "One GPU, a million tokens: the step's memory per token on the CPU",
}
BUDGETS = {"memory": 420, "chromosome": 420, "speed": 420, "scaling": 420, "context": 440, "cpu_memory": 3600}
STEPS = {
    "memory": memory,
    "chromosome": chromosome,
    "speed": speed,
    "scaling": scaling,
    "context": context,
    "cpu_memory": cpu_memory,
}


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", choices=list(STEPS), required=True, help="what to measure (see above)")
    parser.add_argument("--device", default=None, help="default: cuda when available (--smoke: cpu)")
    parser.add_argument(
        "--budget-s", type=float, default=None, help=f"seconds for new cases (default per step: {BUDGETS})"
    )
    parser.add_argument("--steps", type=int, default=None, help="timed training steps per case (default 2; speed 10)")
    parser.add_argument("--longest", type=int, default=4 * M, help="memory: the longest window tried after 1M (2M, 4M)")
    parser.add_argument(
        "--case-cap-s",
        type=float,
        default=60.0,
        help="scaling: skip a case its series' shorter contexts say would take longer",
    )
    parser.add_argument(
        "--data",
        type=Path,
        nargs="+",
        default=[REPO_ROOT / ".device" / "million"],
        help="context: folders of context_data.npz (python -m benchmarks.million_data), read together",
    )
    parser.add_argument("--contexts", type=int, nargs="+", default=[32 * K, 128 * K, M], help="context: scored at")
    parser.add_argument("--train-context", dest="train_context", type=int, default=128 * K)
    parser.add_argument("--train-s", dest="train_s", type=float, default=200.0, help="context: seconds of training")
    parser.add_argument(
        "--score-reserve-s",
        dest="score_reserve_s",
        type=float,
        default=150.0,
        help="context: seconds of the budget kept for scoring",
    )
    parser.add_argument("--learning-rate", dest="learning_rate", type=float, default=3e-4)
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768], help="cpu_memory: the lengths"
    )
    parser.add_argument("--layers", type=int, default=2, help="cpu_memory: the flagship's width with this many layers")
    parser.add_argument("--plots", type=Path, default=None, help="also draw the step's figures in this folder")
    parser.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="chromosome: keep the commands' outputs here (default: a temporary folder, deleted)",
    )


def measure(args: argparse.Namespace) -> dict:
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() and args.step != "cpu_memory" else "cpu"
    args.budget_s = BUDGETS[args.step] if args.budget_s is None else args.budget_s
    args.steps = (10 if args.step == "speed" else 2) if args.steps is None else args.steps
    if args.smoke:
        args.steps = 1
        if args.step == "context":
            args.contexts, args.train_context, args.train_s, args.score_reserve_s = [256, 512], 256, 1.0, 0.0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return STEPS[args.step](args)


BENCHMARK = Benchmark(
    "million",
    "One GPU, a million tokens",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    name_of=lambda args: f"million_{args.step}",
    baseline="the plain runtime (every activation kept) and plain PyTorch (SDPA, Flex), same run",
)


def main(argv: Optional[list[str]] = None) -> dict:
    result = BENCHMARK.main(argv)
    args = BENCHMARK.parser().parse_args(argv)
    if args.plots is not None:
        for path in plots(result["data"], args.plots):
            print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
