"""End-to-end training speed of the ~85M reference model, 8k to 128k tokens, against plain PyTorch.

What runs (every genoformer model built by the LightningCLI parser of `genoformer fit` from a
shipped config plus overrides, recorded per case as `fit_args`):
- genoformer, 12 layers x 768, 12 heads of 64, SwiGLU, RoPE, bf16 autocast, fused AdamW, at 8k x 4,
  16k x 2, 32k, 64k and 128k x 1 tokens; causal dense (`causal`) and configs/genome_8k_gpu.yaml's
  pattern (`window`: three sliding-window layers, one dense); `eager` (fused elementwise regions),
  `plain` (reference elementwise ops) and `compiled` (`model.runtime.compile: true`);
- the anchors, the same architecture in plain PyTorch (benchmarks/train_models.py): `sdpa`
  (FlashAttention-2, causal) and `flex` (FlexAttention with the same block masks), eager and
  compiled; `math` (SDPA's math backend, batch 1) finds where dense attention runs out of memory;
- `profile-*`: the profiler's per-part device time of the 8k step; `fit-real-8k` /
  `fit-synthetic-8k`: the step inside `Trainer.fit` with the config's data module and with a batch
  on the GPU; `ddp-synthetic-8k-x2` the same on two GPUs (DDP); `ceiling`: the bf16 8192^3 matmul.
MFU = model FLOPs / step time / 989 TFLOP/s (H200 dense bf16), model FLOPs per token = 6 x
parameters + 12 x width x (mean keys per query) per layer (the allowed pairs for the window).
Cases run in groups, one child process per group (a crash or timeout loses one group), most
important first, until --budget-s is spent; the rest are recorded as not run.

    python -m benchmarks.train --out OUT                    # one H200: the whole table, ~6 min
    python -m benchmarks.train --out OUT --cases 'fit-synthetic-8k,ddp-synthetic-8k-x2'   # two GPUs
    python -m benchmarks.train --out OUT --from ONE_GPU.json TWO_GPUS.json    # the runs joined
    python -m benchmarks.train --out OUT --cases genoformer-causal-8k-compiled --attention-backend gluon
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from genoformer.kernels.dispatch import Backend
from torch.utils.data import DataLoader

from benchmarks.common import (
    PARTS,
    REPO_ROOT,
    Benchmark,
    RepeatedBatch,
    Summary,
    TrainStep,
    argv,
    at_least,
    compile_counts,
    error_text,
    free_memory,
    median,
    profile_breakdown,
    ratio,
    reset_compile_counts,
    synchronize,
    table,
    time_calls,
    verdict,
)
from benchmarks.train_models import (
    REFERENCE,
    SMOKE,
    PlainDecoder,
    build_genoformer,
    check_flops_formula,
    fit_arguments,
    model_flops_per_token,
    parameter_count,
    sdpa_flash_only,
)

PEAK_TFLOPS = 989.0
ECOLI = REPO_ROOT / "examples" / "ecoli_k12_mg1655.fasta.gz"
BATCH = {8192: 4, 16384: 2, 32768: 1, 65536: 1, 131072: 1}
SMOKE_SCALE = 32
"""--smoke divides every context by this (8k -> 256 tokens)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement. kind: step (time a training step), profile, fit, ceiling."""

    kind: str
    impl: str = "genoformer"  # genoformer, sdpa, flex, math
    pattern: str = "causal"  # causal, window
    context: int = 8192
    mode: str = "eager"  # eager, plain, compiled
    data: str = "synthetic"  # fit only: real or synthetic
    devices: int = 1
    checkpointing: bool = False  # the retry of a 128k step that ran out of memory

    @property
    def batch(self) -> int:
        return 1 if self.impl == "math" else BATCH[self.context]

    @property
    def name(self) -> str:
        tag = f"{self.context // 1024}k"
        if self.kind == "ceiling":
            return "ceiling"
        if self.kind == "fit":
            return f"{'ddp' if self.devices > 1 else 'fit'}-{self.data}-{tag}" + (
                f"-x{self.devices}" if self.devices > 1 else ""
            )
        prefix = "profile-" if self.kind == "profile" else ""
        return f"{prefix}{self.impl}-{self.pattern}-{tag}-{self.mode}" + ("-ckpt" if self.checkpointing else "")


def _steps(*contexts: int, **fields) -> list[Case]:
    return [Case("step", context=c, **fields) for c in contexts]


GROUPS: dict[str, list[Case]] = {  # in run order, one child process each; within a group, the most important first
    "eager-8k": [
        Case("ceiling"),
        *_steps(8192, mode="eager"),
        *_steps(8192, impl="sdpa", mode="eager"),
        *_steps(8192, mode="plain"),
        Case("profile", mode="eager"),
        *_steps(8192, 16384, 32768, impl="math", mode="eager"),
    ],
    "compiled-8k": [
        *_steps(8192, mode="compiled"),
        Case("profile", mode="compiled"),  # fit reuses the graphs
        Case("fit", mode="compiled", data="synthetic"),
        Case("fit", mode="compiled", data="real"),
    ],
    "flex-compiled-8k": [
        *_steps(8192, impl="flex", mode="compiled"),
        *_steps(8192, impl="flex", pattern="window", mode="compiled"),
    ],
    "compiled-long": [
        *_steps(32768, 65536, 131072, mode="compiled"),
        *_steps(32768, 65536, 131072, 8192, pattern="window", mode="compiled"),
        *_steps(16384, mode="compiled"),
    ],
    "eager-long": [*_steps(8192, pattern="window", mode="eager"), *_steps(32768, 65536, 131072, 16384, mode="eager")],
    "anchors-more": [
        *_steps(8192, impl="sdpa", mode="compiled"),
        *_steps(8192, impl="flex", mode="eager"),
        *_steps(32768, 65536, 131072, impl="sdpa", mode="compiled"),
        *_steps(32768, 65536, 131072, impl="flex", mode="compiled"),
    ],
    "ddp-2gpu": [Case("fit", mode="compiled", data="synthetic", devices=2)],
}
SMOKE_CASES = "ceiling,genoformer-causal-8k-eager,sdpa-causal-8k-eager"


def select(patterns: str) -> dict[str, list[Case]]:
    """Group -> its cases matching the comma-separated names or globs (run order kept)."""
    wanted = patterns.split(",")
    cases = {case.name: (group, case) for group, group_cases in GROUPS.items() for case in group_cases}
    unknown = [p for p in wanted if not any(fnmatch.fnmatchcase(name, p) for name in cases)]
    if unknown:
        raise SystemExit(f"--cases: no case matches {unknown}; the cases are {', '.join(cases)}")
    chosen: dict[str, list[Case]] = {}
    for name, (group, case) in cases.items():
        if any(fnmatch.fnmatchcase(name, p) for p in wanted):
            chosen.setdefault(group, []).append(case)
    return chosen


class StepTimer(L.Callback):
    """Wall time of the training steps after `warmup` inside `Trainer.fit` (one device
    synchronisation at each end, none in between)."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end, self.timed_steps = warmup, None, None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            synchronize(pl_module.device)
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.start is not None:
            self.timed_steps += 1
            if trainer.global_step >= trainer.max_steps:
                synchronize(pl_module.device)
                self.end = time.perf_counter()

    @property
    def step_ms(self) -> float:
        if self.start is None or self.end is None or not self.timed_steps:
            raise RuntimeError("StepTimer saw no timed steps: max_steps must exceed the warm-up steps.")
        return (self.end - self.start) / self.timed_steps * 1e3


# ----------------------------------------------------------------------------- the worker
class Worker:
    """Runs one group's cases in this (child) process, one JSON line per case in `cases.jsonl`."""

    def __init__(self, work: Path, smoke: bool, attention_backend: str) -> None:
        self.work, self.smoke = work, smoke
        self.device = torch.device("cpu" if smoke else "cuda")
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.arch = SMOKE if smoke else REFERENCE
        self.backend_args = ["--model.runtime.attention_backend", attention_backend]
        self._store = None

    def context(self, case: Case) -> int:
        return case.context // SMOKE_SCALE if self.smoke else case.context

    def record(self, case: Case, **values) -> None:
        if int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return  # a DDP rank started by Lightning: rank 0 reports
        line = {
            "name": case.name,
            **dataclasses.asdict(case),
            "batch": case.batch,
            "tokens_per_step": case.batch * self.context(case) * case.devices,
            **values,
        }
        with open(self.work / "cases.jsonl", "a") as file:
            file.write(json.dumps(line) + "\n")
        print(f"[train] {case.name}: {values.get('status')}", flush=True)

    def run(self, cases: list[Case]) -> None:
        oom_math_at = None
        for case in cases:
            if case.impl == "math" and oom_math_at is not None and case.context > oom_math_at:
                self.record(case, status="skipped: a shorter context already ran out of memory")
                continue
            values = self.attempt(case)
            self.record(case, **values)
            if values["status"] == "OOM" and case.impl == "math":
                oom_math_at = case.context
            if (
                values["status"] == "OOM"
                and case.impl == "genoformer"
                and case.context >= 131072
                and case.kind == "step"
            ):
                retry = dataclasses.replace(case, checkpointing=True)  # what a user would switch on
                self.record(retry, **self.attempt(retry))

    def attempt(self, case: Case) -> dict:
        reset_compile_counts()
        try:
            return self.measure(case)
        except torch.OutOfMemoryError as error:
            return {"status": "OOM", "error": str(error).splitlines()[0][:300]}
        except Exception as error:  # one failing case must not lose the others
            return {"status": f"error: {error_text(error, 200)}"}
        finally:
            free_memory(self.device)

    def tokens(self, batch: int, context: int) -> torch.Tensor:
        """(B, L) uint8 random windows of the shipped E. coli genome, on the device."""
        from genoformer.data.genome.store import GenomeStore, prepare_genome_store

        if self._store is None:
            self._store = GenomeStore(prepare_genome_store([ECOLI], self.work / "ecoli.zarr", progress=False))
        contig = self._store.contigs[0]
        starts = torch.randint(0, contig.length - context, (batch,), generator=torch.Generator().manual_seed(0))
        return torch.stack(
            [torch.from_numpy(self._store.read(contig.name, s, s + context).copy()) for s in starts.tolist()]
        ).to(self.device)

    def measure(self, case: Case) -> dict:
        if case.kind == "ceiling":
            n = 1024 if self.smoke else 8192
            a, b = (torch.randn(n, n, device=self.device, dtype=self.dtype) for _ in range(2))
            return {
                "status": "ok",
                "matmul_tflops": 2 * n**3 / median(time_calls(lambda: a @ b, self.device, 3, 20)) / 1e9,
            }
        if case.kind == "fit":
            return self.fit(case)
        step, config, parameters, extra = self.build_step(case)
        if case.kind == "profile":
            return {"status": "ok", **profile_breakdown(step.step, self.device, 2 if self.smoke else 3), **extra}
        warmup, steps = (
            (1, 2)
            if self.smoke or case.impl == "math"
            else {8192: (3, 10), 16384: (3, 8), 32768: (2, 5), 65536: (2, 4), 131072: (1, 3)}[case.context]
        )
        t0 = time.perf_counter()
        first_loss = float(step.step())  # compiles a compiled model
        for _ in range(warmup - 1):
            step.step()
        synchronize(self.device)
        warmup_s = time.perf_counter() - t0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        step_ms = median(time_calls(step.step, self.device, warmup=0, calls=steps))
        tokens = case.batch * self.context(case)
        tflops = (
            model_flops_per_token(config, parameters, self.context(case), case.pattern == "window")
            * tokens
            / step_ms
            / 1e9
        )
        return {
            "status": "ok",
            "step_ms": step_ms,
            "tokens_per_s": tokens / (step_ms / 1e3),
            "model_tflops": tflops,
            "mfu": tflops / PEAK_TFLOPS,
            "first_loss": first_loss,
            "warmup_s": warmup_s,
            "parameters": parameters,
            "peak_gib": torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None,
            **compile_counts(),
            **extra,
        }

    def build_step(self, case: Case):
        context = self.context(case)
        arguments = (
            fit_arguments(
                self.arch,
                context,
                case.batch,
                case.pattern == "window",
                case.mode == "compiled",
                fused=case.mode != "plain",
                checkpointing=case.checkpointing,
            )
            + self.backend_args
        )
        torch.manual_seed(0)
        module = build_genoformer(arguments)
        config = module.model.config
        check_flops_formula(config, parameter_count(module.model), context)
        tokens_BL = self.tokens(case.batch, context)
        if case.impl == "genoformer":
            module = module.to(self.device).train()
            if case.mode == "compiled" and self.smoke:  # aot_eager: inductor's C++ compile takes minutes on a CPU
                from genoformer.core.transformer import compile_blocks

                compile_blocks(module.model, backend="aot_eager")
            elif case.mode == "compiled":
                module.configure_model()  # as `genoformer fit` compiles
            step = TrainStep(
                lambda: module.loss(tokens_BL)[0], module.configure_optimizers()["optimizer"], self.device, self.dtype
            )
            return step, config, parameter_count(module.model), {"fit_args": arguments}
        if case.impl == "flex" and self.smoke:
            raise RuntimeError("FlexAttention anchors need CUDA (no CPU backward)")
        flex = None
        if case.impl == "flex":
            from torch.nn.attention.flex_attention import flex_attention

            flex = flex_attention if case.mode == "compiled" else torch.compile(flex_attention)
        if case.impl == "sdpa" and self.device.type == "cuda":
            sdpa_flash_only()
        torch.manual_seed(0)
        anchor = PlainDecoder(config, case.impl, **({"flex": flex} if flex else {})).to(self.device).train()
        if case.mode == "compiled":
            for block in anchor.blocks:
                block.compile(backend="aot_eager" if self.smoke else "inductor")
        optimizer = torch.optim.AdamW(
            anchor.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=self.device.type == "cuda"
        )
        return (
            TrainStep(lambda: anchor.loss(tokens_BL), optimizer, self.device, self.dtype),
            config,
            parameter_count(anchor),
            {},
        )

    def fit(self, case: Case) -> dict:
        """Step time inside `Trainer.fit`, with the real data module or a batch on the GPU."""
        from lightning.pytorch.strategies import DDPStrategy

        from genoformer.training_cli import training_cli

        context = self.context(case)
        warmup, steps = (1, 2) if self.smoke else (3, 15)
        arguments = (
            fit_arguments(self.arch, context, case.batch, False, case.mode == "compiled" and not self.smoke, fused=True)
            + self.backend_args
            + argv(
                "--trainer.max_steps {steps} --trainer.limit_val_batches 0 --trainer.enable_checkpointing false "
                "--trainer.callbacks [] --trainer.enable_progress_bar false --trainer.enable_model_summary false "
                "--model.total_steps 1000 --trainer.default_root_dir {root} --data.init_args.store {store}",
                steps=warmup + steps,
                root=self.work / f"fit-{case.data}-{case.devices}",
                store=self.work / "fit.zarr",
            )
        )
        if self.smoke:
            arguments += argv("--trainer.accelerator cpu --trainer.precision 32-true --data.init_args.num_workers 1")
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
            cli.trainer.fit(
                cli.model, train_dataloaders=DataLoader(RepeatedBatch(batch, warmup + steps + 1), batch_size=None)
            )
        return {
            "status": "ok",
            "step_ms": timer.step_ms,
            "tokens_per_s": case.batch * context * case.devices / timer.step_ms * 1e3,
            "strategy": type(cli.trainer.strategy).__name__,
            "ddp": isinstance(cli.trainer.strategy, DDPStrategy),
            "num_workers": cli.datamodule.num_workers if case.data == "real" else 0,
            "fit_args": arguments,
        }


# ----------------------------------------------------------------------------- the driver
def arguments(parser) -> None:
    parser.add_argument("--cases", help="comma-separated case names or globs (default: all; --smoke: a few)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=360.0,
        help="seconds for the whole run: groups still running then are stopped, later ones skipped",
    )
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=[b.value for b in Backend],
        help="our model's attention backend (model.runtime.attention_backend; default auto)",
    )


def measure(args) -> dict:
    groups = select(args.cases or (SMOKE_CASES if args.smoke else "*"))
    gpus = 0 if args.smoke else torch.cuda.device_count()
    deadline, records, skipped = time.monotonic() + args.budget_s, [], []
    with tempfile.TemporaryDirectory(prefix="genoformer_train_bench_") as tmp:
        work = Path(tmp)
        for group, cases in groups.items():
            needs = max(case.devices for case in cases)
            if needs > max(gpus, 1):
                skipped += [{"name": c.name, "status": f"needs {needs} GPUs, this machine has {gpus}"} for c in cases]
                continue
            left = deadline - time.monotonic()
            if left < 20:
                skipped += [{"name": c.name, "status": "not run: out of the time budget"} for c in cases]
                continue
            command = argv(
                "{python} -m benchmarks.train --worker {work} --cases {cases} --attention-backend {backend}",
                python=sys.executable,
                work=work,
                cases=",".join(c.name for c in cases),
                backend=args.attention_backend,
            ) + (["--smoke"] if args.smoke else [])
            # its own process group, so that a timeout also ends Lightning's DDP ranks and compile workers
            process = subprocess.Popen(command, cwd=REPO_ROOT, start_new_session=True)
            try:
                process.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            lines = (work / "cases.jsonl").read_text().splitlines() if (work / "cases.jsonl").exists() else []
            records = [json.loads(line) for line in lines]
            done = {r["name"] for r in records}
            skipped += [
                {"name": c.name, "status": "not run: the group's process stopped first (time budget or crash)"}
                for c in cases
                if c.name not in done
            ]
    return {"smoke": args.smoke, "peak_tflops": PEAK_TFLOPS, "records": records, "skipped": skipped}


def merge(runs: list[dict]) -> dict:
    """Runs joined (a one-GPU and a two-GPU call, say): every run's cases tagged with its index;
    where two runs measured a case, a failed or unrun one is dropped; ratios pair cases of one run."""
    records = [{**r, "run": r.get("run", i)} for i, run in enumerate(runs) for r in run["records"]]
    last_run = {r["name"]: r["run"] for r in records}
    records = [r for r in records if r.get("status") == "ok" or r["run"] == last_run[r["name"]]]
    measured = {r["name"] for r in records}
    skipped = {s["name"]: s for run in runs for s in run["skipped"] if s["name"] not in measured}
    return {**runs[0], "records": records, "skipped": list(skipped.values())}


# ---------------------------------------------------------------------------- the summary
def _backend(record: dict) -> str:
    args = record.get("fit_args") or []
    return (
        args[args.index("--model.runtime.attention_backend") + 1]
        if "--model.runtime.attention_backend" in args
        else "auto"
    )


def summarize(data: dict) -> Summary:
    records = [r for r in data["records"] if r.get("status") == "ok"]
    by = {r["name"]: r for r in records}

    def partner(record: dict | None, name: str) -> dict | None:  # the case of the same run as `record`
        same = [r for r in records if r["name"] == name and r.get("run") == (record or {}).get("run")]
        return same[-1] if same else by.get(name)

    ceiling = by.get("ceiling", {}).get("matmul_tflops")
    backends = {_backend(r) for r in records if r["kind"] == "step" and r["impl"] == "genoformer"}
    steps = [
        {
            "case": r["name"],
            **({"attention backend": _backend(r)} if len(backends) > 1 else {}),
            "tokens": f"{r['context']:,} x {r['batch']}",
            "step ms": r["step_ms"],
            "tokens/s": round(r["tokens_per_s"]),
            "MFU (989)": f"{100 * r['mfu']:.1f}%",
            "MFU (matmul)": f"{100 * r['model_tflops'] / ceiling:.1f}%" if ceiling else None,
            "peak GiB": r["peak_gib"],
            "graph breaks": r.get("graph_breaks") if r["mode"] == "compiled" else None,
        }
        for r in records
        if r["kind"] == "step"
    ]
    fits = [
        {
            "case": r["name"],
            "step ms": r["step_ms"],
            "tokens/s": round(r["tokens_per_s"]),
            "strategy": r["strategy"],
            "data workers": r["num_workers"],
        }
        for r in records
        if r["kind"] == "fit"
    ]
    profiles = [r for r in records if r["kind"] == "profile" and r["mode"] == "compiled"] or [
        r for r in records if r["kind"] == "profile"
    ]
    headline = {
        "genoformer-causal-8k-eager",
        "sdpa-causal-8k-eager",
        "genoformer-causal-8k-compiled",
        "flex-causal-8k-compiled",
        *(f"genoformer-{p}-{k}k-compiled" for p in ("causal", "window") for k in (32, 64, 128)),
    }
    shown = [
        {k: v for k, v in r.items() if k not in ("MFU (matmul)", "graph breaks")}
        for r in steps
        if r["case"] in headline
    ]
    tables = [
        table(shown or steps, "One optimizer step (median of the timed steps)"),
        table(steps, "Every case", headline=False),
    ]
    if fits:
        tables.append(
            table(
                fits,
                "Inside Trainer.fit (compiled, causal 8k x 4 per GPU; real: the config's data module)",
                headline=False,
            )
        )
    if profiles:
        tables.append(
            table(
                [
                    {
                        "part": part,
                        **{f"{p['name'].removeprefix('profile-')} ms": p["parts"][part] for p in profiles},
                        **{
                            f"{p['name'].removeprefix('profile-')} share": f"{100 * p['parts'][part] / p['total_ms']:.0f}%"
                            for p in profiles
                        },
                    }
                    for part in PARTS
                    if any(p["parts"][part] >= 0.5 for p in profiles)
                ],
                "Where the time goes: device time per part, per step (ms)",
            )
        )
        tables += [
            table(
                [{"kernel": n, "part": part, "ms": ms} for n, part, ms in p["top_kernels"][:12]],
                f"Largest kernels, {p['name']}",
                headline=False,
            )
            for p in profiles
        ]

    def tps(name: str) -> float | None:
        return by[name]["tokens_per_s"] if name in by else None

    def mfu(name: str) -> float | None:
        return 100 * by[name]["mfu"] if name in by else None

    targets = []
    if "genoformer-causal-8k-compiled" in by and len(backends) == 1:
        ddp, real = by.get("ddp-synthetic-8k-x2"), by.get("fit-real-8k")
        one, synthetic = partner(ddp, "fit-synthetic-8k"), partner(real, "fit-synthetic-8k")
        tried = [n for n in {r["name"] for r in data["records"]} if n.startswith("genoformer-") and "-128k-" in n]
        targets = [
            at_least("8k compiled MFU >= 45%", mfu("genoformer-causal-8k-compiled"), 45.0, "%"),
            at_least(
                "8k compiled vs plain PyTorch + compiled Flex >= 1.30x tokens/s",
                ratio(tps("genoformer-causal-8k-compiled"), tps("flex-causal-8k-compiled")),
                1.3,
                "x",
            ),
            at_least("8k eager MFU >= 35%", mfu("genoformer-causal-8k-eager"), 35.0, "%"),
            at_least(
                "8k eager vs plain PyTorch + SDPA eager > 1.00x tokens/s",
                ratio(tps("genoformer-causal-8k-eager"), tps("sdpa-causal-8k-eager")),
                1.0 + 1e-9,
                "x",
            ),
            at_least("32k compiled MFU >= 40%", mfu("genoformer-causal-32k-compiled"), 40.0, "%"),
            at_least("64k compiled MFU >= 40%", mfu("genoformer-causal-64k-compiled"), 40.0, "%"),
            verdict(
                "128k trains on one GPU (batch 1)",
                f"{sum(n in by for n in tried)} of {len(tried)} cases ran",
                any(n in by for n in tried) if tried else None,
            ),
            at_least(
                "2 GPUs (DDP) vs 1 GPU, 8k, Trainer.fit >= 1.85x tokens/s",
                ratio(tps("ddp-synthetic-8k-x2"), one["tokens_per_s"] if one else None),
                1.85,
                "x",
            ),
            verdict(
                "real data module vs a batch on the GPU: step time within 3%",
                f"{100 * (real['step_ms'] / synthetic['step_ms'] - 1):+.1f}%" if real and synthetic else "not measured",
                real["step_ms"] <= 1.03 * synthetic["step_ms"] if real and synthetic else None,
            ),
        ]
    not_run = [r for r in data["records"] if r.get("status") != "ok"] + data["skipped"]
    math_oom = [r["context"] for r in data["records"] if r["impl"] == "math" and r.get("status") == "OOM"]
    notes = (
        [f"Dense PyTorch (SDPA math) attention, batch 1: out of memory at {min(math_oom):,} tokens."]
        if math_oom
        else []
    )
    notes += (
        [
            f"{len({r['name'] for r in not_run})} cases not measured (time budget or memory; the result file "
            "says which and why)."
        ]
        if not_run
        else []
    )
    title = "End-to-end training speed (85M reference model)" + (", per attention backend" if len(backends) > 1 else "")
    return Summary(title=title, tables=tables, targets=targets, notes=notes)


BENCHMARK = Benchmark(
    "train",
    "End-to-end training speed (85M reference model)",
    __doc__,
    measure,
    summarize,
    arguments=arguments,
    merge=merge,
    baseline="the same architecture in plain PyTorch with SDPA FlashAttention-2 and with compiled "
    "FlexAttention; the bf16 matmul ceiling",
    name_of=lambda args: "train" if args.attention_backend == "auto" else f"train_{args.attention_backend}",
)

if __name__ == "__main__":
    if "--worker" in sys.argv:  # one group's cases, in the child process `measure` starts
        worker = argparse.ArgumentParser()
        worker.add_argument("--worker", type=Path)
        worker.add_argument("--cases")
        worker.add_argument("--attention-backend")
        worker.add_argument("--smoke", action="store_true")
        args = worker.parse_args()
        Worker(args.worker, args.smoke, args.attention_backend).run(
            [case for cases in select(args.cases).values() for case in cases]
        )
    else:
        BENCHMARK.main()
