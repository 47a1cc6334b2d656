"""benchmarks/spills.py on the CPU: the step-loop analysis of SASS, and PTX files compiled
elsewhere (FlexAttention's, from a GPU machine) reported as our own kernels are."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import spills

REPO = Path(__file__).resolve().parents[2]

SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/              @!P0 BRA `(.L_x_2) ;
.L_x_3:
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0040*/                   MUFU.EX2 R8, R8 ;
        /*0050*/                   STL [R1], R9 ;
        /*0060*/                   LDL R9, [R1] ;
        /*0070*/                   LDSM.16.M88.4 R12, [R3] ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/               @P1 BRA `(.L_x_3) ;
.L_x_2:
        /*00a0*/                   STL [R1+0x4], R10 ;
        /*00b0*/                   BRA `(.L_x_1) ;
.L_x_4:
        /*00c0*/                   FADD R1, R1, R2 ;
        /*00d0*/                   BRA `(.L_x_4) ;
"""


def test_the_step_loops_are_the_innermost_loops_with_tensor_core_instructions():
    # .L_x_3 is innermost and issues HGMMA; .L_x_1 encloses it; .L_x_4 has no tensor-core instruction
    assert spills.step_loop_spills(SASS) == (1, 1)  # the STL after the loop does not count
    assert spills.step_loop_mix(SASS) == {"loops": 1, "loop_instr": 7, "loop_mma": 1, "loop_exp": 1,
                                          "loop_global_ld": 0, "loop_shared": 1, "loop_sync": 1, "loop_spill": 2}


def test_per_loop_counts_each_step_loop_in_sass_order():
    # a second step loop, after the first: HGMMA twice and no spill
    second = """
.L_x_5:
        /*00e0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*00f0*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24, gsb0 ;
        /*0100*/               @P1 BRA `(.L_x_5) ;
"""
    mix = spills.step_loop_mix(SASS + second, per_loop=True)
    assert mix == {"loops": 2, "loop_instr": "7 / 3", "loop_mma": "1 / 2", "loop_exp": "1 / 0",
                   "loop_global_ld": "0 / 0", "loop_shared": "1 / 0", "loop_sync": "1 / 0", "loop_spill": "2 / 0"}
    assert spills.step_loop_mix(SASS + second)["loop_mma"] == 3


def test_a_missing_or_foreign_ptx_file_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        spills.main(["--ptx", str(tmp_path / "missing.ptx")])
    text = tmp_path / "notes.ptx"
    text.write_text("not ptx\n")
    with pytest.raises(ValueError, match="not a PTX module"):
        spills.main(["--ptx", str(text)])


@pytest.mark.slow
def test_a_ptx_file_reports_as_the_kernel_it_came_from(tmp_path):
    """The PTX of our default dQ kernel (custom pattern, D128, sm_90), written to a file and
    reported by --ptx, gives the registers, spills and step-loop mix of the direct report. (The
    compile runs in a process without TRITON_INTERPRET, which this test session sets.)"""
    pytest.importorskip("triton", reason="triton is not installed: pip install triton")
    path = tmp_path / "bwd_dq_kernel.ptx"
    script = f"""
import json
from benchmarks import spills
case = next(c for c in spills.gpu_cases() if c.key == "custom-128")
config = spills.configs.bwd_candidates(spills._generation(90), 128)[0]
launch = next(x for x in spills.record(case, "bwd", config, 90) if x.kernel == "dq")
ptx, _ = spills.compile_ptx(launch, 90)
open({str(path)!r}, "w").write(ptx)
print(json.dumps(spills.assemble(ptx, 90, mix=True)))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    direct = json.loads(proc.stdout.strip().splitlines()[-1])
    (row,) = spills.main(["--ptx", str(path), "--mix"])
    assert row == {"file": path.name, "sm": 90, "kernel": "bwd_dq_kernel", **direct}
    assert row["loops"] >= 1 and row["loop_mma"] > 0 and row["loop_exp"] > 0


def test_flex_ptx_needs_a_gpu_and_says_what_to_run(tmp_path):
    """benchmarks/flex_ptx.py fetches FlexAttention's PTX on a GPU machine; here it says so."""
    from benchmarks import flex_ptx

    with pytest.raises(SystemExit, match="on a GPU only.*benchmarks.spills --ptx"):
        flex_ptx.main(["--out", str(tmp_path), "--pattern", "custom"])
