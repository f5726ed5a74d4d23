"""ep, cp and fp8 through the CLI: plan table and JSON, simulate --plan, one-line refusals."""

import json

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

MOE = str(EXAMPLES / "moe.py") + ":tiny"
GPT = str(EXAMPLES / "gpt.py") + ":tiny"


def test_plan_table_and_json_show_ep_and_cp(cli_runner):
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16",
                                     "--fix", "ep=2", "--fix", "cp=2", "--top", "1"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("#"))
    assert " ep " in header and " cp " in header
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16",
                                     "--fix", "ep=2,cp=2,dtype=fp8", "--top", "1", "--json"])
    assert result.exit_code == 0, result.output
    best = json.loads(result.output)["plans"][0]
    assert (best["ep"], best["cp"], best["dtype"]) == (2, 2, "fp8")
    assert best["plan"]["ep"] == 2 and best["plan"]["version"] == 2


def test_plan_file_round_trips_through_simulate(cli_runner, tmp_path):
    out = tmp_path / "plan.json"
    result = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--nodes", "1", "--global-batch", "16",
                                     "--fix", "ep=4", "--top", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["ep"] == 4
    result = cli_runner.invoke(cli, ["simulate", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert "ep_all_to_all" in json.loads(result.output)["breakdown"]


def test_simulate_inline_plan_with_ep_and_cp(cli_runner):
    result = cli_runner.invoke(cli, ["simulate", MOE, "--hw", "h100x8", "--plan", "dp=2,ep=2,cp=2,tp=2,gbs=4",
                                     "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["step_time_s"] > 0


def test_refusals_are_one_line_exit_2(cli_runner):
    for args, says in (
        (["plan", GPT, "--hw", "h100x8", "--nodes", "1", "--fix", "ep=2"], "needs routed experts"),
        (["plan", MOE, "--hw", "a100x8", "--nodes", "1", "--fix", "dtype=fp8"], "FP8 tensor cores"),
        (["simulate", MOE, "--hw", "h100x8", "--plan", "dp=3,ep=2"], "must divide tp*cp*dp=3"),
        (["simulate", MOE, "--hw", "h100x8", "--plan", "cp=3,dp=2"], "2*cp=6"),
    ):
        result = cli_runner.invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert says in result.output and "Traceback" not in result.output


def test_a_plan_that_hides_all_to_alls_across_nodes_says_which_megatron_flag_does(cli_runner):
    """The megatron-core stack prices Megatron-Bridge's EP A2A overlap, which Megatron-Core runs
    only when asked: a plan with ep across nodes said nothing of it (GPT-OSS-120B on 8 H100
    nodes: 3.28 s a step with it, 5.16 s without, a reviewer's)."""
    base = ["plan", MOE, "--arg", "experts=16", "--hw", "h100x8", "--nodes", "2", "--global-batch", "64",
            "--fix", "ep=16,mbs=1", "--top", "1", "--json"]  # dp=16: 4 micro-batches, each with a partner
    said = "--overlap-moe-expert-parallel-comm --delay-wgrad-compute (off by default there)"
    notes = json.loads(cli_runner.invoke(cli, base).stdout)["notes"]
    assert any(said in note and "--hw-set efficiency.ep_a2a_overlap=0" in note for note in notes), notes
    for other in (["--stack", "torchtitan"], ["--hw-set", "efficiency.ep_a2a_overlap=0"]):
        assert not any(said in n for n in json.loads(cli_runner.invoke(cli, base + other).stdout)["notes"])
    inside = [a if a != "ep=16,mbs=1" else "ep=8,mbs=1" for a in base]  # inside one node's NVLink: little at stake
    # where the cost model hides nothing (full recompute everywhere; one micro-batch), it says nothing
    for hidden_none in ("ep=16,mbs=1,recompute=full", "ep=16,mbs=4"):
        plan = [a if a != "ep=16,mbs=1" else hidden_none for a in base]
        assert not any(said in n for n in json.loads(cli_runner.invoke(cli, plan).stdout)["notes"]), hidden_none
    assert not any(said in n for n in json.loads(cli_runner.invoke(cli, inside).stdout)["notes"])


def test_simulate_and_whatif_say_what_plan_says_of_hidden_all_to_alls(cli_runner, tmp_path):
    """Only `plan` said the all-to-alls across nodes were priced hidden: simulating the same plan, or
    sweeping ep in whatif, gave the faster figure without a word (a review's finding)."""
    said = "--overlap-moe-expert-parallel-comm --delay-wgrad-compute (off by default there)"
    run = ["--arg", "experts=16", "--hw", "h100x8", "--nodes", "2"]
    plan = "dp=16,ep=16,mbs=1,gbs=64"
    notes = json.loads(cli_runner.invoke(cli, ["simulate", MOE, *run, "--plan", plan, "--json"]).stdout)["notes"]
    assert any(said in n for n in notes), notes
    off = cli_runner.invoke(cli, ["simulate", MOE, *run, "--plan", plan, "--hw-set", "efficiency.ep_a2a_overlap=0",
                                  "--json"])
    assert not any(said in n for n in json.loads(off.stdout)["notes"])
    # a hardware file of one's own (its name no bundled profile's): the sweep's notes price its points on it
    from smplan.hwprofiles.loader import PROFILE_DIR

    mine = tmp_path / "mine.toml"
    mine.write_text((PROFILE_DIR / "h100x8.toml").read_text().replace('name = "h100x8"', 'name = "mycluster"'))
    own = [a if a != "h100x8" else str(mine) for a in run]
    swept = cli_runner.invoke(cli, ["whatif", MOE, *own, "--plan", "dp=16,mbs=1,gbs=64", "--vary", "ep=1,16",
                                    "--seeds", "2", "--jobs", "1", "-o", str(tmp_path / "w"), "--json"])
    assert swept.exit_code == 0, swept.output
    notes = [n for n in json.loads(swept.stdout)["notes"] if said in n]
    assert len(notes) == 1 and notes[0].startswith("note (#1): this plan hides"), notes


def test_an_ep_past_the_cluster_names_the_nodes_it_needs(cli_runner):
    """It said only "no mesh of 8 GPUs has the fixed keys"."""
    result = cli_runner.invoke(cli, ["plan", MOE, "--arg", "experts=16", "--hw", "h100x8", "--fix", "ep=16"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "ep=16 needs at least 16 GPUs (ep divides tp*cp*dp) but the cluster has 8; use --nodes 2" in result.output
    # with --max-nodes the hint names --max-nodes: "--nodes 2" there is the fewest nodes to search
    capped = cli_runner.invoke(cli, ["plan", MOE, "--arg", "experts=16", "--hw", "h100x8", "--max-nodes", "1",
                                     "--fix", "ep=16"])
    assert capped.exit_code == 2 and "but the cluster has 8; use --max-nodes 2 or a lower ep" in capped.output
    too_many = cli_runner.invoke(cli, ["plan", MOE, "--hw", "h100x8", "--max-nodes", "1", "--fix", "dp=8,pp=2"])
    assert too_many.exit_code == 2 and "but the cluster has 8; use --max-nodes 2 or lower a degree" in too_many.output


def test_fixed_keys_that_keep_the_model_whole_say_which_to_drop(cli_runner):
    """Mixtral with tp=pp=ep=1, zero=0 fixed was told "no change within 256x the nodes fits: use a
    smaller model", though ZeRO-3 over two nodes fits it (a review's finding)."""
    mixtral = ["plan", f"{EXAMPLES}/moe.py:mixtral_8x7b", "--hw", "h100x8"]
    result = cli_runner.invoke(cli, [*mixtral, "--fix", "tp=1,pp=1,ep=1,zero=0"])
    assert result.exit_code == 2 and result.output.strip().endswith("the smallest change that fits: --nodes 2 with "
                                                                    "zero=3"), result.output
    huge = cli_runner.invoke(cli, ["plan", f"{EXAMPLES}/gpt.py:gpt3_175b", "--hw", "a100x8", "--global-batch", "512",
                                   "--fix", "tp=1,pp=1,zero=3,mbs=64"])
    # zero=3 is already the least a GPU holds of the states: not a key to drop
    assert huge.exit_code == 2 and "fits with --fix tp=1,pp=1,mbs=64, which set what each GPU holds: drop one" \
        in huge.output, huge.output
