"""End-to-end training speed of the ~85M reference model, 8k to 128k tokens, against plain PyTorch.

    python -m benchmarks.train --out DIR                     (one H200: the whole table, ~6 min)
    python -m benchmarks.train --out DIR --cases 'fit-synthetic-8k,ddp-synthetic-8k-x2'   (two GPUs)
    python -m benchmarks.train --out DIR --smoke             (a tiny CPU run of every code path)
    python -m benchmarks.train --list                        (the case names, in run order)
    python -m benchmarks.train --out DIR [--merge DIR2] --render --markdown BENCHMARKS.md
                                                 (measure nothing: DIR/train.json merged and rendered again)

What runs (every genoformer model is built by the LightningCLI parser of `genoformer fit` from a
shipped config plus overrides, recorded per case as `fit_args`):
- genoformer, 12 layers x 768, 12 heads of 64, SwiGLU, RoPE, DNA vocabulary, bf16 autocast,
  fused AdamW, at 8k x 4, 16k x 2, 32k, 64k and 128k x 1 tokens; causal dense (`causal`) and
  configs/genome_8k_gpu.yaml's pattern (`window`: three sliding-window layers, one dense);
  `eager` (with the fused elementwise regions), `plain` (eager, reference elementwise ops:
  what the fusion buys) and `compiled` (`model.runtime.compile: true`);
- the anchors, the same architecture in plain PyTorch (benchmarks/train_models.py): `sdpa`
  (FlashAttention-2, causal) and `flex` (FlexAttention with the same block masks), eager and
  compiled (`flex` eager calls a compiled flex_attention); `math` (SDPA's math backend, batch 1)
  finds the context at which dense attention runs out of memory;
- `profile-*`: the PyTorch profiler's per-part device time of the 8k step;
- `fit-real-8k` / `fit-synthetic-8k`: step time inside `Trainer.fit` with the config's real data
  module (workers, the E. coli store) and with a batch already on the GPU; `ddp-synthetic-8k-x2`
  the same on two GPUs with the DDP strategy file;
- `ceiling`: bf16 8192^3 matmul rate, the second MFU denominator (the first is 989 TFLOP/s).

Cases run in groups, one subprocess per group (a crash or a timeout loses one group, never the
results before it), most important first, until `--budget-s` is spent; each finished case is
appended to DIR/cases.jsonl at once, and DIR/train.json and DIR/train.md are rewritten after
every group, so a run cut short still leaves its table. The short table prints last.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Optional

import torch
from torch.utils.data import DataLoader

from benchmarks.common import (
    TrainStep,
    command_line,
    compile_counts,
    describe_environment,
    median,
    replace_markdown_section,
    reset_compile_counts,
    synchronize,
    time_calls,
    write_atomically,
    write_json_file,
)
from benchmarks.train_measure import StepTimer, matmul_ceiling_tflops, profile_breakdown
from benchmarks.train_models import (
    REFERENCE,
    REPO_ROOT,
    SMOKE,
    Architecture,
    PlainDecoder,
    build_genoformer,
    check_flops_formula,
    fit_arguments,
    model_flops_per_token,
    parameter_count,
    sdpa_flash_only,
)
from genoformer.kernels.dispatch import Backend
from benchmarks.train_report import merge_runs, render_markdown, short_table

PEAK_TFLOPS = 989.0
"""H200 dense bf16 tensor-core peak, the first MFU denominator."""

ECOLI = REPO_ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz"
BATCH = {8192: 4, 16384: 2, 32768: 1, 65536: 1, 131072: 1}
SMOKE_SCALE = 32
"""--smoke divides every context by this (8k -> 256 tokens)."""


# ------------------------------------------------------------------------------- the cases
@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement. kind: step (time a training step), profile, fit, ceiling, probe (memory)."""

    kind: str
    impl: str = "genoformer"  # genoformer, sdpa, flex, math
    pattern: str = "causal"  # causal, window
    context: int = 8192
    mode: str = "eager"  # eager, plain, compiled
    data: str = "synthetic"  # fit only: real or synthetic
    devices: int = 1
    checkpointing: bool = False  # activation checkpointing (the retry of a 128k step that ran out of memory)

    @property
    def batch(self) -> int:
        return 1 if self.impl == "math" else BATCH[self.context]

    @property
    def name(self) -> str:
        tag = f"{self.context // 1024}k"
        if self.kind == "ceiling":
            return "ceiling"
        if self.kind == "fit":
            return f"{'ddp' if self.devices > 1 else 'fit'}-{self.data}-{tag}" + (f"-x{self.devices}" if self.devices > 1 else "")
        prefix = "profile-" if self.kind == "profile" else ""
        return f"{prefix}{self.impl}-{self.pattern}-{tag}-{self.mode}" + ("-ckpt" if self.checkpointing else "")

    @property
    def compiled(self) -> bool:
        return self.mode == "compiled"


def _steps(*contexts: int, **fields) -> list[Case]:
    return [Case("step", context=c, **fields) for c in contexts]


# Groups in run order; one subprocess each. Within a group, the most important case first.
GROUPS: dict[str, list[Case]] = {
    "eager-8k": [
        Case("ceiling"),
        *_steps(8192, mode="eager"),
        *_steps(8192, impl="sdpa", mode="eager"),
        *_steps(8192, mode="plain"),
        Case("profile", mode="eager"),
        *_steps(8192, 16384, 32768, impl="math", mode="eager"),
    ],
    # one process: the fit cases reuse the step cases' compiled graphs
    "compiled-8k": [
        *_steps(8192, mode="compiled"),
        Case("profile", mode="compiled"),
        Case("fit", mode="compiled", data="synthetic"),
        Case("fit", mode="compiled", data="real"),
    ],
    "flex-compiled-8k": [
        *_steps(8192, impl="flex", mode="compiled"),
        *_steps(8192, impl="flex", pattern="window", mode="compiled"),
    ],
    # static graphs at 32k, one dynamic-shape recompile at 64k per kind of layer, then reused
    "compiled-long": [
        *_steps(32768, 65536, 131072, mode="compiled"),
        *_steps(32768, 65536, 131072, 8192, pattern="window", mode="compiled"),
        *_steps(16384, mode="compiled"),
    ],
    "eager-long": [
        *_steps(8192, pattern="window", mode="eager"),
        *_steps(32768, 65536, 131072, 16384, mode="eager"),
    ],
    "anchors-more": [
        *_steps(8192, impl="sdpa", mode="compiled"),
        *_steps(8192, impl="flex", mode="eager"),
        *_steps(32768, 65536, 131072, impl="sdpa", mode="compiled"),
        *_steps(32768, 65536, 131072, impl="flex", mode="compiled"),
    ],
    "ddp-2gpu": [Case("fit", mode="compiled", data="synthetic", devices=2)],
}
SMOKE_CASES = (
    "ceiling", "genoformer-causal-8k-eager", "sdpa-causal-8k-eager", "profile-genoformer-causal-8k-eager",
    "genoformer-causal-8k-compiled", "genoformer-causal-32k-compiled", "fit-synthetic-8k", "fit-real-8k",
    "genoformer-window-8k-eager", "math-causal-8k-eager",
)


def all_cases() -> dict[str, tuple[str, Case]]:
    return {case.name: (group, case) for group, cases in GROUPS.items() for case in cases}


def select(patterns: Optional[str], smoke: bool) -> dict[str, list[Case]]:
    """Group -> its selected cases (run order kept). patterns: comma-separated names or globs."""
    wanted = patterns.split(",") if patterns else (list(SMOKE_CASES) if smoke else ["*"])
    cases = all_cases()
    unknown = [p for p in wanted if not any(fnmatch.fnmatchcase(name, p) for name in cases)]
    if unknown:
        raise SystemExit(f"--cases: no case matches {unknown}; `python -m benchmarks.train --list` lists them.")
    chosen: dict[str, list[Case]] = {}
    for name, (group, case) in cases.items():
        if any(fnmatch.fnmatchcase(name, p) for p in wanted):
            chosen.setdefault(group, []).append(case)
    return chosen


# ----------------------------------------------------------------------------- the worker
class Worker:
    """Runs one group's cases in this process and appends one JSON record per case."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.smoke = args.smoke
        self.device = torch.device("cpu" if args.smoke else "cuda")
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.arch: Architecture = SMOKE if args.smoke else REFERENCE
        self.out = args.out
        self.compile_backend = "aot_eager" if args.smoke else "inductor"
        # the model's attention backend (`model.runtime.attention_backend`): auto unless asked
        self.backend_args = ["--model.runtime.attention_backend", args.attention_backend]
        self.tmp = Path(tempfile.mkdtemp(prefix="genoformer_train_bench_"))
        self._store = None

    def context(self, case: Case) -> int:
        return case.context // SMOKE_SCALE if self.smoke else case.context

    def record(self, case: Case, **values) -> None:
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return  # a DDP rank started by Lightning: rank 0 reports
        line = json.dumps({"name": case.name, **dataclasses.asdict(case), "batch": case.batch,
                           "tokens_per_step": case.batch * self.context(case) * case.devices, **values})
        with open(self.out / "cases.jsonl", "a") as file:
            file.write(line + "\n")
            file.flush()
            os.fsync(file.fileno())
        print(f"[train bench] {case.name}: {values.get('status')}"
              + (f", {values['tokens_per_s']:,.0f} tokens/s" if values.get("tokens_per_s") else ""), flush=True)

    def run(self, cases: list[Case]) -> None:
        try:
            self._run(cases)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _run(self, cases: list[Case]) -> None:
        oom_math_at: Optional[int] = None
        for case in cases:
            if case.impl == "math" and oom_math_at is not None and case.context > oom_math_at:
                self.record(case, status="skipped: a shorter context already ran out of memory")
                continue
            values = self.attempt(case)
            self.record(case, **values)
            if values["status"] == "OOM" and case.impl == "math":
                oom_math_at = case.context
            if values["status"] == "OOM" and case.impl == "genoformer" and case.context >= 131072 and case.kind == "step":
                retry = dataclasses.replace(case, checkpointing=True)  # what a user would switch on
                self.record(retry, **self.attempt(retry))

    def attempt(self, case: Case) -> dict:
        reset_compile_counts()
        try:
            return self.measure(case)
        except torch.OutOfMemoryError as error:
            return {"status": "OOM", "error": str(error).splitlines()[0][:300]}
        except Exception as error:  # one failing case must not lose the others
            return {"status": f"error: {type(error).__name__}: {str(error)[:200]}", "error": traceback.format_exc()[-3000:]}
        finally:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    # -------------------------------------------------------------------------- measuring
    def measure(self, case: Case) -> dict:
        if case.kind == "ceiling":
            return {"status": "ok", "matmul_tflops": matmul_ceiling_tflops(self.device, 1024 if self.smoke else 8192)}
        if case.kind == "fit":
            return self.fit(case)
        model_step, config, parameters, extra = self.build_step(case)
        if case.kind == "profile":
            breakdown = profile_breakdown(model_step.step, self.device, steps=2 if self.smoke else 3)
            return {"status": "ok", **breakdown, **extra}
        warmup, steps = self.step_counts(case)
        t0 = time.perf_counter()
        first_loss = float(model_step.step())  # compiles a compiled model
        for _ in range(warmup - 1):
            model_step.step()
        synchronize(self.device)
        warmup_s = time.perf_counter() - t0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        times = time_calls(model_step.step, self.device, warmup=0, calls=steps)
        step_ms = median(times)
        tokens = case.batch * self.context(case)
        flops_per_token = model_flops_per_token(config, parameters, self.context(case), case.pattern == "window")
        tflops = flops_per_token * tokens / (step_ms / 1e3) / 1e12
        return {
            "status": "ok",
            "step_ms": step_ms,
            "step_ms_all": times,
            "tokens_per_s": tokens / (step_ms / 1e3),
            "model_tflops": tflops,
            "mfu": tflops / PEAK_TFLOPS,
            "peak_gib": torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None,
            "first_loss": first_loss,
            "warmup_s": warmup_s,
            "warmup_steps": warmup,
            **compile_counts(),
            "parameters": parameters,
            **extra,
        }

    def step_counts(self, case: Case) -> tuple[int, int]:
        """(warm-up, timed) steps: a few for long contexts, where one step takes seconds."""
        if self.smoke or case.impl == "math":  # math: a memory probe, its speed is beside the point
            return 1, 2
        return {8192: (3, 10), 16384: (3, 8), 32768: (2, 5), 65536: (2, 4), 131072: (1, 3)}[case.context]

    def tokens(self, batch: int, context: int, seed: int = 0) -> torch.Tensor:
        """(B, L) uint8 random windows of the shipped E. coli genome, on the device."""
        from genoformer.data.genome.store import GenomeStore, prepare_genome_store

        if self._store is None:
            self._store = GenomeStore(prepare_genome_store([ECOLI], self.tmp / "ecoli.zarr", progress=False))
        contig = self._store.contigs[0]
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, contig.length - context, (batch,), generator=generator).tolist()
        rows = [torch.from_numpy(self._store.read(contig.name, s, s + context).copy()) for s in starts]
        return torch.stack(rows).to(self.device)

    def build_step(self, case: Case):
        context = self.context(case)
        arguments = fit_arguments(self.arch, context, case.batch, case.pattern == "window", case.compiled,
                                  fused=case.mode != "plain", checkpointing=case.checkpointing) + self.backend_args
        torch.manual_seed(0)
        module = build_genoformer(arguments)
        config = module.model.config
        check_flops_formula(config, parameter_count(module.model), context)
        extra = {"fit_args": arguments, "activation_checkpointing": module.runtime.activation_checkpointing}
        tokens_BL = self.tokens(case.batch, context)
        if case.impl == "genoformer":
            module = module.to(self.device).train()
            if case.compiled:
                self.compile_genoformer(module)
            optimizer = module.configure_optimizers()["optimizer"]
            model_step = TrainStep(lambda: module.loss(tokens_BL)[0], optimizer, self.device, self.dtype)
            return model_step, config, parameter_count(module.model), extra
        if case.impl == "flex" and self.smoke:
            raise RuntimeError("FlexAttention anchors need CUDA (no CPU backward)")
        flex = None
        if case.impl == "flex":
            from torch.nn.attention.flex_attention import flex_attention

            flex = flex_attention if case.compiled else torch.compile(flex_attention)
        if case.impl == "sdpa" and self.device.type == "cuda":
            sdpa_flash_only()
        torch.manual_seed(0)
        anchor = PlainDecoder(config, case.impl, **({"flex": flex} if flex is not None else {})).to(self.device).train()
        if case.compiled:
            for block in anchor.blocks:
                block.compile(backend=self.compile_backend)
        optimizer = torch.optim.AdamW(anchor.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                      fused=self.device.type == "cuda")
        model_step = TrainStep(lambda: anchor.loss(tokens_BL), optimizer, self.device, self.dtype)
        extra = {"activation_checkpointing": False}
        return model_step, config, parameter_count(anchor), extra

    def compile_genoformer(self, module) -> None:
        """As `genoformer fit` does with `model.runtime.compile: true` (Lightning's configure_model hook);
        the CPU smoke run compiles with aot_eager instead of inductor (seconds, not minutes)."""
        if self.smoke:
            from genoformer.core.transformer import compile_blocks

            compile_blocks(module.model, backend=self.compile_backend)
        else:
            module.configure_model()

    # ----------------------------------------------------------------------- Trainer.fit
    def fit(self, case: Case) -> dict:
        """Step time inside `Trainer.fit`, with the real data module or a batch on the GPU."""
        from lightning.pytorch.strategies import DDPStrategy

        from genoformer.cli import training_cli

        context = self.context(case)
        warmup, steps = (1, 2) if self.smoke else (3, 15)
        run_dir = self.tmp / f"fit-{case.data}-{case.devices}"
        # the smoke run fits eagerly: inductor's C++ compile takes minutes on a small CPU
        arguments = fit_arguments(self.arch, context, case.batch, False, case.compiled and not self.smoke,
                                  fused=True) + self.backend_args
        arguments += [
            "--trainer.max_steps", str(warmup + steps), "--trainer.limit_val_batches", "0",
            "--trainer.enable_checkpointing", "false", "--trainer.callbacks", "[]",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.default_root_dir", str(run_dir), "--data.init_args.store", str(self.tmp / "fit.zarr"),
            "--model.total_steps", "1000",
        ]
        if self.smoke:
            arguments += ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true",
                          "--data.init_args.num_workers", "1"]
        if case.devices > 1:
            arguments += ["--config", "configs/strategies/ddp.yaml", "--trainer.devices", str(case.devices)]
        torch.manual_seed(0)
        cli = training_cli(arguments, run=False)
        timer = StepTimer(warmup)
        cli.trainer.callbacks.append(timer)
        if case.data == "real":
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        else:
            device = torch.device("cpu") if self.smoke else torch.device("cuda", cli.trainer.local_rank)
            batch = {"tokens": self.tokens(case.batch, context).to(device)}
            loader = DataLoader(_Repeat(batch, warmup + steps + 1), batch_size=None)
            cli.trainer.fit(cli.model, train_dataloaders=loader)
        tokens = case.batch * context * case.devices
        return {
            "status": "ok",
            "step_ms": timer.step_ms,
            "tokens_per_s": tokens / (timer.step_ms / 1e3),
            "timed_steps": timer.timed_steps,
            "strategy": type(cli.trainer.strategy).__name__,
            "ddp": isinstance(cli.trainer.strategy, DDPStrategy),
            "num_workers": cli.datamodule.num_workers if case.data == "real" else 0,
            "fit_args": arguments,
        }


class _Repeat(torch.utils.data.Dataset):
    """The same (already batched, already on the device) batch, n times."""

    def __init__(self, batch: dict, n: int) -> None:
        self.batch, self.n = batch, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        return self.batch


# ----------------------------------------------------------------------------- the driver
def drive(args: argparse.Namespace) -> dict:
    groups = select(args.cases, args.smoke)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cases.jsonl").unlink(missing_ok=True)
    deadline = time.monotonic() + args.budget_s
    started = time.monotonic()
    skipped: list[tuple[str, str]] = []
    gpus = 0 if args.smoke else torch.cuda.device_count()
    for group, cases in groups.items():
        needs = max(case.devices for case in cases)
        if not args.smoke and needs > gpus:
            skipped += [(case.name, f"needs {needs} GPUs, this machine has {gpus}") for case in cases]
            continue
        if args.smoke and needs > 1:
            skipped += [(case.name, "multi-GPU: not in the CPU smoke run (tests/core/test_ddp.py runs DDP on CPUs)")
                        for case in cases]
            continue
        left = deadline - time.monotonic()
        if left < 20:
            skipped += [(case.name, "not run: out of the time budget") for case in cases]
            continue
        run_group(args, group, cases, timeout_s=left)
        publish(args, skipped, time.monotonic() - started)
    return publish(args, skipped, time.monotonic() - started, final=True)


def run_group(args: argparse.Namespace, group: str, cases: list[Case], timeout_s: float) -> None:
    command = [sys.executable, "-m", "benchmarks.train", "--worker", group, "--out", str(args.out),
               "--cases", ",".join(case.name for case in cases), "--attention-backend", args.attention_backend
               ] + (["--smoke"] if args.smoke else [])
    print(f"[train bench] group {group}: {len(cases)} cases, {timeout_s:.0f} s left", flush=True)
    # its own process group, so that a timeout also ends Lightning's DDP ranks and compile workers
    process = subprocess.Popen(command, cwd=REPO_ROOT, start_new_session=True)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        print(f"[train bench] group {group}: stopped at the time budget", flush=True)
    if process.returncode not in (0, -signal.SIGKILL):
        print(f"[train bench] group {group}: exited with {process.returncode}", flush=True)
    done = {record["name"] for record in read_records(args.out)}
    with open(args.out / "cases.jsonl", "a") as file:
        for case in cases:
            if case.name not in done:
                why = "not run: the group's process stopped first (time budget or crash; see the log)"
                file.write(json.dumps({"name": case.name, **dataclasses.asdict(case), "batch": case.batch,
                                       "status": why}) + "\n")


def read_records(out: Path) -> list[dict]:
    path = out / "cases.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- reporting
def publish(args: argparse.Namespace, skipped: list[tuple[str, str]], wall_s: float, final: bool = False) -> dict:
    records = read_records(args.out)
    summary = {
        "environment": describe_environment("cpu" if args.smoke else None),
        "command": command_line(),
        "smoke": args.smoke,
        "wall_s": wall_s,
        "peak_tflops": PEAK_TFLOPS,
        "records": records,
        "skipped": [{"name": name, "status": why} for name, why in skipped],
    }
    write_json_file(args.out / "train.json", summary)
    write_atomically(args.out / "train.md", render_markdown(summary) + "\n")
    if final:
        print(short_table(summary))
    return summary


# ------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "train",
                        help="folder for cases.jsonl (one line per case), train.json and train.md")
    parser.add_argument("--cases", default=None, help="comma-separated case names or globs (default: all)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="seconds for the whole run: groups still running then are stopped, later ones skipped")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run of every code path (tests)")
    parser.add_argument("--attention-backend", default="auto", choices=[b.value for b in Backend],
                        help="our model's attention backend (model.runtime.attention_backend), e.g. gluon or "
                             "flash_attn_4 to compare the two in separate runs (default: auto)")
    parser.add_argument("--list", action="store_true", help="print the case names in run order and exit")
    parser.add_argument("--render", action="store_true",
                        help="measure nothing: OUT/train.json, merged with the --merge runs, rendered again into "
                             "OUT/train.json and OUT/train.md (and --markdown)")
    parser.add_argument("--markdown", type=Path, default=None, help="also rewrite the `training-speed` section of this file")
    parser.add_argument("--merge", type=Path, action="append", default=[], metavar="DIR",
                        help="with --render: add the cases of another run's folder (repeatable; later runs win)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.list:
        for group, cases in GROUPS.items():
            print(f"{group}: " + ", ".join(case.name for case in cases))
        return
    if args.worker is not None:
        groups = select(args.cases, args.smoke)
        Worker(args).run([case for cases in groups.values() for case in cases])
        return
    if args.render:
        summary = merge_runs([json.loads((out / "train.json").read_text()) for out in [args.out, *args.merge]])
        write_json_file(args.out / "train.json", summary)  # one file holds the whole table
        write_atomically(args.out / "train.md", render_markdown(summary) + "\n")
        if args.markdown is not None:
            replace_markdown_section(args.markdown, "training-speed", render_markdown(summary))
        print(short_table(summary))
        return
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("benchmarks.train measures a CUDA GPU; run `python -m benchmarks.train --smoke` on a CPU.")
    summary = drive(args)
    if args.markdown is not None:
        replace_markdown_section(args.markdown, "training-speed", render_markdown(summary))


if __name__ == "__main__":
    main()
