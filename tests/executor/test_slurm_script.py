"""The sbatch script `execute --launcher slurm` writes: paths sbatch reads as one value, the CPUs
srun is given, a rendezvous port per job, and the node counts it is written for."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from smplan.executor import PlanMismatchError
from smplan.executor.launch import sbatch_path_problem, sbatch_script
from smplan.executor.nodes import check_even_split, slurm_nnodes
from smplan.planner.plan import parse_inline, plan_from_inline


def _script(tmp_path, folder="slurm run"):
    run_dir = tmp_path / folder
    run_dir.mkdir()
    path = run_dir / "smplan.sbatch"
    path.write_text(sbatch_script(run_dir / "run_config.json", nnodes=2, nproc_per_node=4, gpus_per_node=4))
    subprocess.run(["bash", "-n", str(path)], check=True)
    return run_dir, path.read_text()


def test_the_job_log_path_is_one_sbatch_value_with_its_spaces(tmp_path):
    run_dir, text = _script(tmp_path, "slurm run 100%")
    line = next(line for line in text.splitlines() if line.startswith("#SBATCH --output="))
    # sbatch splits an #SBATCH line at unquoted spaces and drops the quotes (src/sbatch/opt.c,
    # _get_argument), as shlex does; a literal % is "%%" in its filename pattern
    assert shlex.split(line[len("#SBATCH "):]) == [f"--output={tmp_path}/slurm run 100%%/smplan-%j.out"]
    assert sbatch_path_problem(run_dir) is None
    assert "holds '\"'" in sbatch_path_problem(tmp_path / 'a"b') and "-o/--output" in sbatch_path_problem("a\\b")


def test_srun_is_given_the_jobs_cpus(tmp_path):
    _, text = _script(tmp_path)
    # Slurm 22.05-23.02's srun does not inherit --cpus-per-task from sbatch (sbatch(1), --cpus-per-task)
    assert text.index("export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK") < text.index("\nsrun ")


def test_each_job_rendezvouses_on_a_port_of_its_own(tmp_path):
    _, text = _script(tmp_path)
    assert "29500" not in text and '--rdzv-endpoint="$head_node:$rdzv_port"' in text
    port_line = next(line for line in text.splitlines() if line.startswith("rdzv_port="))

    def port(job_id: int) -> int:
        shell = f"SLURM_JOB_ID={job_id}; {port_line}; echo $rdzv_port"
        return int(subprocess.run(["bash", "-c", shell], check=True, capture_output=True, text=True).stdout)

    ports = [port(job_id) for job_id in (1, 2, 9_999, 10_000, 4_294_967_295)]
    assert len(set(ports[:3])) == 3  # neighbouring jobs on one node differ
    assert all(1024 <= p < 32768 for p in ports)  # unprivileged, below Linux's ephemeral range


def _inline(text: str):
    return plan_from_inline(parse_inline(text), model="m.py", hw="local", nodes=1, gpus_per_node=16, num_blocks=4)


def test_an_inline_plan_past_a_nodes_gpus_needs_nnodes():
    plan = _inline("pp=2,dp=8,mbs=1,gbs=32")
    with pytest.raises(PlanMismatchError, match=r"its 16 processes .* pass --nnodes N \(e.g. --nnodes 2, 8 per node\)"):
        slurm_nnodes("pp=2,dp=8,mbs=1,gbs=32", plan, None, None)
    assert slurm_nnodes("pp=2,dp=8,mbs=1,gbs=32", plan, 4, None) == 4
    assert slurm_nnodes("pp=2,dp=8,mbs=1,gbs=32", plan, None, 8) == 2
    assert slurm_nnodes("dp=8,mbs=1,gbs=8", _inline("dp=8,mbs=1,gbs=8"), None, None) == 1


def test_a_node_count_that_does_not_divide_the_processes_names_those_that_do():
    check_even_split(16, 4)
    with pytest.raises(PlanMismatchError, match=r"16 processes do not split evenly over 3 nodes .*use --nnodes 2 or 4$"):
        check_even_split(16, 3)
    with pytest.raises(PlanMismatchError, match=r"use --nnodes 16$"):
        check_even_split(16, 20)
