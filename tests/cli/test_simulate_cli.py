import json

import pytest

from smplan.cli.main import cli
from tests.conftest import EXAMPLES

GPT = f"{EXAMPLES / 'gpt.py'}:tiny"
FIGURES = ("step_time_s", "tokens_per_s", "samples_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
           "peak_memory_gib", "bubble_fraction", "breakdown", "usd_per_step")


def _one_error_line(result):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output


def test_simulate_model_inline_json(cli_runner, tmp_path):
    trace, gantt = tmp_path / "step.json", tmp_path / "step.png"
    result = cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--plan", "tp=2,pp=2,dp=2,mbs=1,gbs=16",
                                     "--json", "--trace", str(trace), "--gantt", str(gantt)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in FIGURES:
        assert key in data
    assert data["step_time_s"] > 0 and len(data["stage_utilisation"]) == 2
    assert data["unit"] == "token"  # what tokens_per_s counts
    assert json.loads(trace.read_text())["traceEvents"]
    assert gantt.read_bytes()[:4] == b"\x89PNG"


def test_a_model_without_sequences_says_its_rate_counts_samples(cli_runner):
    result = cli_runner.invoke(cli, ["simulate", str(EXAMPLES / "mlp.py"), "--hw", "a100x8", "--plan",
                                     "dp=8,mbs=4,gbs=32", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["unit"] == "sample" and data["tokens_per_s"] == data["samples_per_s"]


def test_simulate_plan_file_table(cli_runner, tmp_path):
    from smplan.planner import plan_from_inline, profile_model

    profile = profile_model(GPT)
    plan = plan_from_inline("pp=2,dp=4,mbs=1,gbs=32", model=GPT, hw="a100x8", nodes=1, gpus_per_node=8,
                            num_blocks=profile.num_blocks)
    path = tmp_path / "plan.json"
    plan.save(path)
    result = cli_runner.invoke(cli, ["simulate", str(path)])
    assert result.exit_code == 0, result.output
    assert "step time" in result.output and "per-stage time, % of the step" in result.output
    off = cli_runner.invoke(cli, ["simulate", str(path), "--no-contention", "--json"])
    data = json.loads(off.output)
    assert data["contention"] is False
    assert (data["model"], data["hw"], data["nodes"], data["num_gpus"]) == (GPT, "a100x8", 1, 8)  # what ran
    # more nodes than the plan lays out would only idle: refused, not silently ignored
    _one_error_line(cli_runner.invoke(cli, ["simulate", str(path), "--nodes", "2"]))
    assert cli_runner.invoke(cli, ["simulate", str(path), "--nodes", "1"]).exit_code == 0
    if data["closed_form_step_time_s"] is not None:
        assert data["step_time_s"] == pytest.approx(data["closed_form_step_time_s"], rel=0.05)


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "missing-plan.json"],
        ["simulate", GPT, "--plan", "tp=2"],  # no --hw
        ["simulate", GPT, "--hw", "a100x8"],  # no --plan
        ["simulate", GPT, "--hw", "a100x8", "--plan", "tp=3"],  # tp does not divide the heads / cluster
        ["simulate", GPT, "--hw", "a100x8", "--plan", "bogus=1"],
        ["simulate", GPT, "--hw", "a100x8", "--plan", "dp=64"],  # more GPUs than the node
        ["simulate", GPT, "--hw", "nope", "--plan", "dp=1"],
        ["simulate", GPT, "--hw", "a100x8", "--plan", "dp=1", "--hw-set", "inter_node.bandwidth_gbps=0"],
    ],
)
def test_simulate_bad_inputs_one_line_exit_2(cli_runner, args):
    _one_error_line(cli_runner.invoke(cli, args))


def test_simulate_bad_plan_json(cli_runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    _one_error_line(cli_runner.invoke(cli, ["simulate", str(bad)]))


def test_plan_that_does_not_fit_is_simulated_with_a_warning(cli_runner):
    # A 1 GiB GPU cannot hold even the tiny GPT's activations at this batch: the user's own
    # configuration is still simulated, but the output says it would run out of memory.
    args = ["simulate", GPT, "--hw", "a100x8", "--hw-set", "gpu.memory_gib=0.01", "--plan", "tp=1,pp=1,dp=8,mbs=8,gbs=64"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "warning: the fullest GPU needs" in text.output and "run out of memory" in text.output
    # the peak holds the memory reserve; the capacity is the GPU's whole memory, not a "usable" share
    assert "(its memory reserve included) but A100-SXM4-80GB has 0.01 GiB" in text.output, text.output
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).output)
    assert data["fits_memory"] is False and data["peak_memory_gib"] > data["memory_capacity_gib"] > 0
    ok = json.loads(cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--plan", "tp=1,pp=1,dp=8,mbs=1,gbs=8",
                                            "--json"]).output)
    assert ok["fits_memory"] is True


def test_a_plan_of_a_builder_without_seq_len_simulates(cli_runner, tmp_path):
    """`smplan plan` records the profile's sequence length; replaying the plan file must not
    hand it to a builder that takes no seq_len (its batch() already has that length)."""
    import json

    model = tmp_path / "tokens.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(50, 16)\n"
        "        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))\n"
        "        self.head = nn.Linear(16, 50)\n\n"
        "    def forward(self, x):\n"
        "        h = self.emb(x)\n"
        "        for b in self.blocks:\n"
        "            h = h + b(h)\n"
        "        return self.head(h)\n\n\n"
        "def model():\n    return Net()\n\n\n"
        "def batch(micro_batch_size, model=None, seed=0):\n"
        "    g = torch.Generator().manual_seed(seed)\n"
        "    t = torch.randint(0, 50, (micro_batch_size, 9), generator=g)\n"
        "    return t[:, :-1], t[:, 1:]\n\n\n"
        "def loss(out, targets):\n"
        "    return nn.functional.cross_entropy(out.flatten(0, 1), targets.flatten())\n")
    plan = tmp_path / "p.json"
    made = cli_runner.invoke(cli, ["plan", str(model), "--hw", "a100x8", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    assert json.loads(plan.read_text())["seq_len"] == 8
    replayed = cli_runner.invoke(cli, ["simulate", str(plan), "--json"])
    assert replayed.exit_code == 0, replayed.output
    wrong = cli_runner.invoke(cli, ["simulate", str(model), "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8",
                                    "--seq-len", "16"])
    assert wrong.exit_code == 2 and "takes no seq_len argument and its batch() has 8" in wrong.output


def test_a_launch_bound_plan_says_the_gpu_waits_for_the_host(cli_runner):
    """gpt.py:tiny on an A100 is bound by its kernel launches; with no host time it is not."""
    args = ["simulate", GPT, "--hw", "a100x8", "--plan", "dp=8,mbs=1,gbs=8"]
    text = cli_runner.invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "host_wait" in text.output and "note: the GPU waits" in text.output and "1075 us per layer pass" in text.output
    data = json.loads(cli_runner.invoke(cli, [*args, "--json"]).output)
    assert data["breakdown"]["host_wait"] > 0.5 * data["step_time_s"]
    bare = cli_runner.invoke(cli, [*args, "--hw-set", "efficiency.host_overhead_us_per_layer=0"])
    assert bare.exit_code == 0 and "host_wait" not in bare.output and "note: the GPU waits" not in bare.output


def test_trace_or_gantt_never_replace_the_input_plan_file(cli_runner, tmp_path):
    plan = tmp_path / "p.json"
    assert cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "-o", str(plan)]).exit_code == 0
    before = plan.read_text()
    result = cli_runner.invoke(cli, ["simulate", str(plan), "--trace", str(plan), "--force"])
    assert result.exit_code == 2 and "names the input" in result.output, result.output
    assert plan.read_text() == before
    model = tmp_path / "m.py"  # a model file, builder named or not
    model.write_text((EXAMPLES / "gpt.py").read_text())
    for ref in (str(model), f"{model}:tiny"):
        result = cli_runner.invoke(cli, ["simulate", ref, "--hw", "a100x8", "--plan", "dp=8", "--trace", str(model),
                                         "--force"])
        assert result.exit_code == 2 and "names the input" in result.output, result.output
    assert model.read_text() == (EXAMPLES / "gpt.py").read_text()


def test_wave_quantisation_without_an_sm_count_says_it_does_nothing(cli_runner):
    args = ["simulate", "examples/gpt.py:tiny", "--hw", "b300x8", "--plan", "dp=8", "--hw-set", "efficiency.gemm_tile=128"]
    result = cli_runner.invoke(cli, args)
    assert result.exit_code == 0 and "states no gpu.sm_count" in result.stderr, result.output
    stated = cli_runner.invoke(cli, [*args, "--hw-set", "gpu.sm_count=160"])
    assert stated.exit_code == 0 and "sm_count" not in stated.stderr
    off = cli_runner.invoke(cli, args[:-2])
    assert off.exit_code == 0 and "gemm_tile" not in off.stderr


def test_json_notes_hold_the_wave_quantisation_warning(cli_runner):
    """--json "notes" holds every note and warning the text prints, this one (said before the run) too."""
    hw = ["--hw", "b300x8", "--hw-set", "efficiency.gemm_tile=128"]
    for args in (["simulate", "examples/gpt.py:tiny", *hw, "--plan", "dp=8"],
                 ["plan", "examples/gpt.py:tiny", *hw, "--top", "1", "--closed-form"]):
        result = cli_runner.invoke(cli, [*args, "--json"])
        assert result.exit_code == 0, result.output
        assert any("states no gpu.sm_count" in note for note in json.loads(result.stdout)["notes"]), args


def test_a_plan_files_bad_hw_override_is_named_as_the_files(cli_runner, tmp_path):
    plan = tmp_path / "p.json"
    assert cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "-o", str(plan)]).exit_code == 0
    data = json.loads(plan.read_text())
    data["hw_overrides"] = {"efficiency.gemm_tile": -1}
    plan.write_text(json.dumps(data))
    result = cli_runner.invoke(cli, ["simulate", str(plan)])
    assert result.exit_code == 2, result.output
    assert "hw_overrides" in result.output and "--hw-set" not in result.output and "gemm_tile" in result.output
    # a wrong --hw is the user's, not the file's; a --hw-set of the same key wins over the file
    wrong_hw = cli_runner.invoke(cli, ["simulate", str(plan), "--hw", "a100x9"])
    assert wrong_hw.exit_code == 2 and "unknown hardware profile 'a100x9'" in wrong_hw.output
    assert "hw_overrides" not in wrong_hw.output
    fixed = cli_runner.invoke(cli, ["simulate", str(plan), "--hw-set", "efficiency.gemm_tile=0"])
    assert fixed.exit_code == 0, fixed.output


def test_the_header_says_what_recomputes_as_the_plan_file_now_reads(cli_runner, tmp_path):
    # A stage's recompute kind counts for its recompute_blocks only: a hand edit of the kind alone
    # changes nothing, and the header says so rather than leaving it to the figures.
    base = ["simulate", GPT, "--hw", "a100x8", "--plan"]
    some = cli_runner.invoke(cli, base + ["dp=2,mbs=1,gbs=2,zero=1,recompute=full,stages=4:1"])
    assert some.exit_code == 0, some.output
    assert "zero=1, recompute=full 1/4, " in some.output.splitlines()[0]
    plan = json.loads(cli_runner.invoke(cli, base + ["dp=2,mbs=1,gbs=2,recompute=full,stages=4:0", "--json"]).output)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({k: v for k, v in plan["plan"].items() if k != "recompute"}))
    edited = cli_runner.invoke(cli, ["simulate", str(path)])
    assert "zero=0, recompute=none, " in edited.output.splitlines()[0], edited.output


def test_a_plan_files_hardware_overrides_are_shown(cli_runner, tmp_path):
    """`plan --hw-set` records its overrides in the plan file; simulate applies them and shows
    them (header and --json), and says they follow a --hw swap."""
    plan = tmp_path / "p.json"
    made = cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "--hw-set", "gpu.memory_gib=40",
                                   "--top", "1", "-o", str(plan)])
    assert made.exit_code == 0, made.output
    shown = cli_runner.invoke(cli, ["simulate", str(plan)])
    assert shown.exit_code == 0 and "stack megatron-core, hardware overrides gpu.memory_gib=40" in shown.output
    swapped = cli_runner.invoke(cli, ["simulate", str(plan), "--hw", "h100x8", "--json"])
    assert swapped.exit_code == 0, swapped.output
    assert "note: hardware overrides (gpu.memory_gib=40) apply on --hw h100x8 as on a100x8" in swapped.output
    assert json.loads(swapped.stdout)["hw_overrides"] == {"gpu.memory_gib": 40}


@pytest.mark.parametrize("plan, shown", [
    ("dp=8,zero=0", "DP all-reduce"), ("dp=8,zero=3", "DP reduce-scatter + all-gather (ZeRO)"), ("tp=4,dp=1", "no DP")])
def test_the_header_names_the_dp_collectives_the_plan_runs(cli_runner, plan, shown):
    result = cli_runner.invoke(cli, ["simulate", "examples/gpt.py:tiny", "--hw", "a100x8", "--plan", plan])
    assert result.exit_code == 0, result.output
    assert f", {shown}, stack megatron-core" in result.output.splitlines()[0]


def test_a_missing_plan_file_names_a_command_that_makes_one(cli_runner, tmp_path):
    missing = tmp_path / "missing.json"
    result = cli_runner.invoke(cli, ["simulate", str(missing)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert f"does not exist; create it with `smplan plan MODEL --hw HW -o {missing}`" in lines[0]


@pytest.mark.parametrize("plan, advice", [
    ("dp=8,mbs=8,gbs=64", "Add recompute=full or selective, zero=1..3 or more tp/pp"),
    ("dp=8,mbs=8,gbs=64,zero=2,recompute=full", "Add zero=3 or more tp/pp"),
    ("dp=8,mbs=8,gbs=64,zero=3,recompute=full", "Add more tp/pp"),
])
def test_the_out_of_memory_advice_leaves_out_what_the_plan_already_does(cli_runner, plan, advice):
    result = cli_runner.invoke(cli, ["simulate", GPT, "--hw", "a100x8", "--hw-set", "gpu.memory_gib=0.01",
                                     "--plan", plan])
    assert result.exit_code == 0, result.output
    assert f"this plan would run out of memory. {advice} (or let `smplan plan` choose)." in result.output


@pytest.mark.parametrize("capacity, said", [(1234.5, "1234.5"), (139.8, "139.8"), (80.0, "80")])
def test_the_out_of_memory_warning_states_the_capacity_as_given(capacity, said):
    from smplan.cli.notes import out_of_memory_warning

    assert f"H100 has {said} GiB; this plan would run out of memory" in out_of_memory_warning(2000.0, capacity, "H100")


@pytest.mark.parametrize("need, said", [(79.97, "79.97"), (79.651, "79.66"), (2000.0, "2000.00"), (1.1, "1.10")])
def test_the_out_of_memory_warning_rounds_the_need_up(need, said):
    """The tables print 79.97 GiB as 79.9 (rounded down, so a fitting plan never reads as full);
    the warning said 80.0, and at 0.1 a need of 79.651 on 79.65 GiB would read as fitting."""
    from smplan.cli.notes import out_of_memory_warning

    assert f"the fullest GPU needs {said} GiB (its memory reserve included) but H100 has 79.65 GiB" in (
        out_of_memory_warning(need, 79.65, "H100"))


def test_an_inline_plan_the_model_cannot_run_is_refused_for_that_before_the_clusters_size(cli_runner):
    """tp=4 x dp=4 on one 8-GPU node of a model without a tp_plan: "add --nodes" would only lead
    into the tp_plan refusal, so that one comes first."""
    result = cli_runner.invoke(cli, ["simulate", str(EXAMPLES / "cnn.py"), "--hw", "a100x8",
                                     "--plan", "dp=4,tp=4,mbs=1,gbs=4"])
    assert result.exit_code == 2 and "defines no tp_plan" in result.output and "--nodes" not in result.output, \
        result.output
