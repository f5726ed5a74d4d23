"""`smplan execute --launcher slurm`: the script parses and asks for the resources the plan needs
(nodes, GPUs or none, its --time), with every path one word; what it cannot submit is one line."""

from __future__ import annotations

import json
import subprocess

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"  # 4 blocks, 4 heads, seq 16


def _invoke(cli_runner, *args):
    return cli_runner.invoke(cli, ["execute", *args])


def test_slurm_script(cli_runner, tmp_path):
    out = tmp_path / "run"
    result = _invoke(cli_runner, "dp=4,tp=2,mbs=1,gbs=8", "--model", GPT, "--launcher", "slurm",
                     "--nnodes", "2", "--nproc-per-node", "4", "--max-restarts", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    script = out / "smplan.sbatch"
    assert f"sbatch {script}" in result.output
    text = script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)
    for needle in ("#SBATCH --nodes=2", "#SBATCH --ntasks=2", "#SBATCH --ntasks-per-node=1",
                   "#SBATCH --gpus-per-node=4", "srun --nodes=2 --ntasks=2", "--nnodes=2",
                   "--nproc-per-node=4", "--rdzv-backend=c10d", '--rdzv-endpoint="$head_node:', "--max-restarts=2",
                   "-m smplan.executor.worker", str(out / "run_config.json"),
                   # as the local launcher: local rank 0 on the job's log, every rank's logs in RUN_DIR/elastic
                   f"--log-dir={out / 'elastic'} --tee=2 --local-ranks-filter=0 --redirects=1:1,2:1,3:1"):
        assert needle in text, needle
    config = json.loads((out / "run_config.json").read_text())
    assert config["plan"]["dp"] == 4 and config["plan"]["tp"] == 2
    assert f'#SBATCH --output="{out}/smplan-%j.out"' in text  # the job's log beside the run, not in the submit dir
    # the unsubmitted script is the job's: neither another script nor a local run rewrites it
    script.write_text(text + "# my edit\n")
    for launcher in (["--launcher", "slurm", "--nnodes", "2", "--nproc-per-node", "4"], []):
        refused = _invoke(cli_runner, "dp=4,tp=2,mbs=1,gbs=8", "--model", GPT, *launcher, "--out", str(out))
        assert refused.exit_code == 2 and "a Slurm script" in refused.output and f"sbatch {script}" in refused.output
    assert script.read_text().endswith("# my edit\n")
    assert json.loads((out / "run_config.json").read_text()) == config
    refused = _invoke(cli_runner, "dp=4,tp=2,mbs=1,gbs=8", "--model", GPT, "--launcher", "slurm", "--nnodes", "2",
                      "--nproc-per-node", "4", "--rdzv-endpoint", "host:1234", "--out", str(tmp_path / "other"))
    assert refused.exit_code == 2 and "--rdzv-endpoint applies to --launcher local" in refused.output


def test_slurm_time_limit(cli_runner, tmp_path):
    # an inline plan predicts nothing: one hour, and the line says how to set it
    inline = _invoke(cli_runner, "dp=2,mbs=1,gbs=4", "--model", GPT, "--launcher", "slurm", "--out", str(tmp_path / "a"))
    assert inline.exit_code == 0, inline.output
    assert "#SBATCH --time=01:00:00" in (tmp_path / "a" / "smplan.sbatch").read_text()
    assert "its --time is 01:00:00: the plan predicts no step time (an inline plan, or a file without" in inline.output
    # a plan file's prediction: 1.5 x step x steps + 10 minutes for each of 2 attempts, up to the minute
    path = tmp_path / "plan.json"
    made = cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--nodes", "1", "-o", str(path)])
    assert made.exit_code == 0, made.output
    step_s = json.loads(path.read_text())["predicted"]["step_time_s"]
    steps = int(3600 / step_s)  # ~40 minutes of steps with the margin: 2 x 10 + 60 = 80 minutes
    planned = _invoke(cli_runner, str(path), "--launcher", "slurm", "--steps", str(steps), "--max-restarts", "1",
                      "--out", str(tmp_path / "b"), "--json")
    assert planned.exit_code == 0, planned.output
    minutes = -(-(1200 + 1.5 * step_s * steps) // 60)
    expected = f"{int(minutes) // 60:02d}:{int(minutes) % 60:02d}:00"
    assert json.loads(planned.stdout)["time_limit"] == expected and expected.startswith("01:")
    assert f"#SBATCH --time={expected}" in (tmp_path / "b" / "smplan.sbatch").read_text()
    given = _invoke(cli_runner, str(path), "--launcher", "slurm", "--time-limit", " 2-00:00:00", "--out", str(tmp_path / "c"))
    assert given.exit_code == 0 and "#SBATCH --time=2-00:00:00\n" in (tmp_path / "c" / "smplan.sbatch").read_text()
    # a resume prices only the steps after its checkpoint
    ckpt = tmp_path / "e" / "checkpoints" / f"step-{steps - 10}"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("ok\n")
    (ckpt / "smplan.json").write_text(json.dumps({"fingerprint": json.loads((tmp_path / "b" / "run_config.json")
                                                                             .read_text())["fingerprint"],
                                                  "step": steps - 10}))
    resumed = _invoke(cli_runner, str(path), "--launcher", "slurm", "--steps", str(steps), "--out", str(tmp_path / "e"))
    assert resumed.exit_code == 0, resumed.output
    assert f"x 10 steps, plus 10 minutes of start-up (the steps after step-{steps - 10}); --time-limit" in resumed.output
    for args, needle in ((["--time-limit", "90"], "use it with --launcher slurm"),
                         (["--launcher", "slurm", "--time-limit", "1h"], "must be a Slurm time"),
                         (["--launcher", "slurm", "--time-limit", "0:00"], "above zero")):
        refused = _invoke(cli_runner, str(path), *args, "--out", str(tmp_path / "d"))
        assert refused.exit_code == 2 and needle in refused.output, refused.output
        assert not (tmp_path / "d").exists()


def test_slurm_spans_the_plan_files_nodes(cli_runner, tmp_path):
    """A plan for 2 nodes of 8 GPUs is a 2-node job by default, not 16 GPUs on one node."""
    path = tmp_path / "plan.json"
    made = cli_runner.invoke(cli, ["plan", GPT, "--hw", "a100x8", "--nodes", "2", "-o", str(path)])
    assert made.exit_code == 0, made.output
    assert json.loads(path.read_text())["nodes"] == 2
    result = _invoke(cli_runner, str(path), "--launcher", "slurm", "--out", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "smplan.sbatch: 2 nodes x 8 GPUs (--nnodes / --nproc-per-node set them)" in result.output
    text = (tmp_path / "run" / "smplan.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=8\n" in text and "--nproc-per-node=8" in text
    given = _invoke(cli_runner, str(path), "--launcher", "slurm", "--nnodes", "4", "--out", str(tmp_path / "four"))
    assert given.exit_code == 0 and "#SBATCH --gpus-per-node=4\n" in (tmp_path / "four" / "smplan.sbatch").read_text()
    # processes per node given: the nodes they fill
    packed = _invoke(cli_runner, str(path), "--launcher", "slurm", "--nproc-per-node", "16", "--out", str(tmp_path / "p"))
    assert packed.exit_code == 0 and "#SBATCH --nodes=1\n" in (tmp_path / "p" / "smplan.sbatch").read_text()
    # the local launcher starts every process here, and says so (a stage split the model no longer has
    # stops it before the launch)
    local = _invoke(cli_runner, str(path), "--arg", "layers=2", "--out", str(tmp_path / "local"))
    assert local.exit_code == 2
    assert "note: the plan is for 2 nodes; all 16 of its processes start on this machine" in local.stderr


def test_slurm_run_directory_with_a_space(cli_runner, tmp_path):
    """Every path the user copies or sbatch reads stays one word: the submit line, the refusal, --output."""
    import shlex

    out = tmp_path / "slurm run"
    result = _invoke(cli_runner, "dp=2,mbs=1,gbs=8", "--model", GPT, "--launcher", "slurm", "--out", str(out))
    assert result.exit_code == 0, result.output
    script = out / "smplan.sbatch"
    submit = next(line for line in result.output.splitlines() if line.startswith("submit it with:"))
    assert shlex.split(submit.split(":", 1)[1]) == ["sbatch", str(script)]
    assert f'#SBATCH --output="{out}/smplan-%j.out"\n' in script.read_text()
    refused = _invoke(cli_runner, "dp=2,mbs=1,gbs=8", "--model", GPT, "--launcher", "slurm", "--out", str(out))
    assert refused.exit_code == 2 and f"(sbatch {shlex.quote(str(script))})" in refused.output
    quoted = _invoke(cli_runner, "dp=2,mbs=1,gbs=8", "--model", GPT, "--launcher", "slurm", "--out", str(tmp_path / 'a"b'))
    assert quoted.exit_code == 2 and len(quoted.output.strip().splitlines()) == 1 and "cannot carry" in quoted.output


def test_slurm_inline_plan_past_one_node_asks_for_nnodes(cli_runner, tmp_path):
    refused = _invoke(cli_runner, "pp=2,dp=8,mbs=1,gbs=32", "--model", GPT, "--launcher", "slurm", "--out", str(tmp_path / "a"))
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1, refused.output
    assert "16 processes" in refused.output and "--nnodes 2" in refused.output
    assert not (tmp_path / "a" / "smplan.sbatch").exists()
    given = _invoke(cli_runner, "pp=2,dp=8,mbs=1,gbs=32", "--model", GPT, "--launcher", "slurm", "--nnodes", "2",
                    "--out", str(tmp_path / "b"))
    assert given.exit_code == 0, given.output
    text = (tmp_path / "b" / "smplan.sbatch").read_text()
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=8\n" in text
    uneven = _invoke(cli_runner, "pp=2,dp=8,mbs=1,gbs=32", "--model", GPT, "--launcher", "slurm", "--nnodes", "3",
                     "--out", str(tmp_path / "c"))
    assert uneven.exit_code == 2 and "16 processes do not split evenly over 3 nodes" in uneven.output
    assert "--nnodes 2 or 4" in uneven.output and "asked for" not in uneven.output


def test_slurm_world_size_must_match(cli_runner, tmp_path):
    result = _invoke(cli_runner, "dp=4,mbs=1,gbs=4", "--model", GPT, "--launcher", "slurm",
                     "--nnodes", "2", "--nproc-per-node", "4", "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "4 processes but 8" in result.output


def test_a_cpu_profiles_plan_asks_slurm_for_no_gpu(cli_runner, tmp_path, probed):
    plan = tmp_path / "plan.json"
    made = cli_runner.invoke(cli, ["plan", GPT, "--hw", str(probed), "--fix", "dp=2", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    result = _invoke(cli_runner, str(plan), "--launcher", "slurm", "--out", str(tmp_path / "run"),
                     "--keep-checkpoints", "2")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "run" / "smplan.sbatch").read_text()
    assert "--gpus-per-node" not in text and "--nproc-per-node=2" in text
    assert "x 2 processes (no GPU: the plan's hardware is a CPU profile)" in result.output
    # --keep-checkpoints without checkpoints to keep: said, not silently dropped
    assert "note: --keep-checkpoints 2 does nothing here: this run saves no checkpoint" in result.output
