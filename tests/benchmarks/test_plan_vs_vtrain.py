"""benchmarks/plan_vs_vtrain.py (and validate_published.py): held-out vTrain CSVs are read in either column style, and a
wrong --extra or --hw-set is one line and exit code 2 before any work."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from published import PublishedFileError, read_vtrain_csv  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "plan_vs_vtrain.py"
FOLDER_HEADER = "params_b,gpus,global_batch,micro_batch,hidden,heads,layers,seq_len,tp,dp,pp,iteration_ms"
REPO_HEADER = ("Parameters (billion),# GPUs,global batch,micro batch,hidden size,attention heads,# layers,"
               "sequence length,tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)")
ROW = "39.1,512,1536,2,8192,64,48,2048,4,32,4,13875.5"


@pytest.mark.parametrize("header", [FOLDER_HEADER, REPO_HEADER])
def test_reads_both_column_styles(tmp_path, header):
    path = tmp_path / "runs.csv"
    path.write_text(f"{header}\n{ROW}\n")
    (row,) = read_vtrain_csv(path)
    assert (row["label"], row["tp"], row["pp"], row["dp"], row["mbs"], row["gbs"]) == ("39.1B", 4, 4, 32, 2, 1536)
    assert row["measured_s"] == pytest.approx(13.8755)


@pytest.mark.parametrize("text, says", [
    ("a,b\n1,2\n", "no column 'gpus'"),
    (f"{FOLDER_HEADER}\n39.1,512,x,2,8192,64,48,2048,4,32,4,1\n", ":2: every value must be a number"),
    (f"{FOLDER_HEADER}\n", "no rows"),
])
def test_bad_csv_is_named(tmp_path, text, says):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    with pytest.raises(PublishedFileError, match=says):
        read_vtrain_csv(path)


def _run(*args, script=SCRIPT):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--extra", "no/such.csv"], "--extra no/such.csv: no such file"),
    (["--hw-set", "nope=1"], "unknown hardware key 'nope'"),
    (["--hw-set", "efficiency.matmul_max"], "needs the form key=value"),
])
def test_wrong_input_is_one_line_and_exit_2(args, says):
    result = _run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr


def test_bad_extra_file_is_rejected_before_any_work(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("a,b\n1,2\n")
    result = _run("--extra", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert f"--extra {path}: no column 'gpus'" in result.stderr


def test_validate_published_rejects_a_wrong_hw_set_before_any_row():
    result = _run("--hw-set", "nope=1", script=ROOT / "benchmarks" / "validate_published.py")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown hardware key 'nope'" in lines[0]


def test_the_cli_gives_the_benchmark_figure_of_a_row(tmp_path, cli_runner):
    # The benchmarks profile examples/gpt.py through the public API, unpatched, so
    # `smplan simulate` of a row's model and plan is the benchmark's figure for that row.
    import json

    from published import nodes_for, plan_for, row_profile
    from smplan.hwprofiles import load_cluster
    from smplan.simulator import simulate_plan

    from smplan.cli.main import cli

    path = tmp_path / "runs.csv"
    path.write_text(f"{REPO_HEADER}\n3.6,64,512,8,3072,32,30,2048,4,16,1,4634.4\n")
    (row,) = read_vtrain_csv(path)
    cluster = load_cluster("a100x8", nodes=nodes_for(row), overrides=row["hw_set"])
    bench = simulate_plan(plan_for(row, cluster.nodes), row_profile(row), cluster, True, record_events=False)
    args = [f"--arg={k}={row[k]}" for k in ("layers", "hidden", "heads", "vocab")] + [f"--arg=seq_len={row['seq']}"]
    spec = (f"tp={row['tp']},pp={row['pp']},dp={row['dp']},mbs={row['mbs']},gbs={row['gbs']},recompute=full,"
            "schedule=1f1b,zero=0,sp=0,overlap_dp=0,dtype=fp16")
    result = cli_runner.invoke(cli, ["simulate", str(ROOT / "examples" / "gpt.py"), "--hw", "a100x8", "--nodes",
                                     str(cluster.nodes), "--hw-set", "inter_node.bandwidth_gbps=12.5", "--plan", spec,
                                     "--json", *args])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures.get("figures", figures)["step_time_s"] == pytest.approx(bench.step_time_s, rel=1e-9)
    assert any(m.tp_dim == "n" for m in row_profile(row).post[0].matmuls)  # the head is vocab-parallel
