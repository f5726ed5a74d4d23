"""grad_compress run for real: dp=2 on gloo (2 processes) with torch's DDP communication hooks.

One learnable token stream (next token = successor), six steps; PowerSGD compresses from step 3
(executor/grad_compress.py POWERSGD_START_STEP), so its first two steps equal the uncompressed
run's and the rest do not; a SIGKILL after the step-3 checkpoint resumes bit for bit, which
needs PowerSGD's error feedback, warm-start matrices and step counter back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from smplan.cli.main import cli
from tests.executor.runs import metrics, run_execute

STEPS = 6
PLAN = "dp=2,zero=0,mbs=2,gbs=8"


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    path = tmp_path_factory.mktemp("gc") / "train.bin"
    (np.arange(200 * 17) % 64).astype(np.uint16).tofile(path)  # tiny GPT: seq_len 16, vocab 64
    return ("--data", str(path), "--lr", "1e-2", "--steps", str(STEPS))


def _losses(tmp_path, name: str, plan: str, stream, *args, env=None) -> tuple[list[float], str]:
    out = tmp_path / name
    result = run_execute(plan, out, *stream, *args, env=env, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    return [r["loss"] for r in metrics(out)], result.stdout


@pytest.fixture(scope="module")
def plain(tmp_path_factory, stream):
    return _losses(tmp_path_factory.mktemp("none"), "run", PLAN, stream)[0]


@pytest.fixture(scope="module")
def psgd(tmp_path_factory, stream):
    return _losses(tmp_path_factory.mktemp("psgd"), "run", PLAN + ",grad_compress=powersgd:4", stream,
                   "--checkpoint-every", "3")[0]


def test_powersgd_dp2_learns_and_compresses_from_step_3(plain, psgd):
    assert all(math.isfinite(x) for x in psgd) and psgd[-1] < psgd[0] - 0.5, psgd
    assert psgd[:2] == plain[:2] and psgd[2:] != pytest.approx(plain[2:], rel=1e-6), (psgd, plain)


@pytest.mark.slow
def test_bf16_matches_uncompressed_under_ddp_and_fsdp(tmp_path, stream, plain):
    bf16, _ = _losses(tmp_path, "bf16", PLAN + ",grad_compress=bf16", stream)
    assert bf16 == pytest.approx(plain, rel=2e-3)  # bf16 rounding of the averaged gradients only
    # FSDP2 (zero=2): bf16 is its reduce_dtype; the same run within bf16 rounding
    fsdp_bf16, _ = _losses(tmp_path, "fsdp-bf16", "dp=2,zero=2,mbs=2,gbs=8,grad_compress=bf16", stream)
    assert fsdp_bf16 == pytest.approx(plain, rel=2e-3)


@pytest.mark.slow
def test_powersgd_resumes_bit_identical_after_sigkill(tmp_path, stream, psgd):
    # killed at step 5, restarted from the step-3 checkpoint: the same losses bit for bit
    again, log = _losses(tmp_path, "psgd-faulty", PLAN + ",grad_compress=powersgd:4", stream,
                         "--checkpoint-every", "3", "--max-restarts", "1", env={"SMPLAN_FAIL_AT_STEP": "5"})
    assert "resumed from" in log and "no PowerSGD state" not in log
    assert again == psgd


@pytest.mark.parametrize("plan,says", [
    ("dp=2,tp=2,mbs=1,gbs=4,grad_compress=powersgd:4", "DDP hook"),
    ("dp=2,zero=1,mbs=1,gbs=4,grad_compress=powersgd:4", "needs zero=0"),
])
def test_powersgd_outside_ddp_is_refused_in_one_line(cli_runner, tmp_path, plan, says):
    result = cli_runner.invoke(cli, ["execute", plan, "--model", "examples/gpt.py:tiny", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.output
