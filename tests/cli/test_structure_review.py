"""Findings of the structure review: a pp reason names the forward's line that met a None layer
and what a stage sets to None; the blocks rule says shapes count, and a pyramid of one class
says which blocks differ; profile warns of a model plan and execute refuse; execute reports
samples/s for a model without sequences, as plan does."""

import json
import textwrap

import pytest
from smplan.executor.metrics import progress, summarize
from smplan.planner import Plan, blocks_problem, profile_model
from torch import nn

from smplan.cli.main import cli
from smplan.model import find_layout
from tests.conftest import EXAMPLES
from tests.executor.runs import run_execute

# A small bidirectional encoder whose forward skips None blocks but calls its embedding and head
# unconditionally (the review's tied.py); FORWARDS swaps in the forward under test.
ENCODER = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Linear(d, d)

    def forward(self, x):
        return x + self.ff(self.ln(x))


class Enc(nn.Module):
    def __init__(self, vocab=32, d=16, layers=2, seq_len=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
{forward}


def model():
    return Enc()


def batch(micro_batch_size, model=None, seed=0):
    ids = torch.randint(0, 32, (micro_batch_size, 8), generator=torch.Generator().manual_seed(seed))
    return ids, ids.clone()
'''
FORWARDS = {
    # the first stage (no ln, out) fails at the head
    "head": ("""
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        for l in self.layers:
            if l is not None:
                x = l(x)
        return self.out(self.ln(x))""", "return self.out(self.ln(x))", "where self.ln, self.out are None"),
    # the head is skipped; the last stage (no emb, pos) fails at the embedding
    "embedding": ("""
        x = self.emb(ids)
        for l in self.layers:
            if l is not None:
                x = l(x)
        return self.out(self.ln(x)) if self.out is not None else x""", "x = self.emb(ids)",
                  "where self.emb is None"),
}


@pytest.mark.parametrize("case", sorted(FORWARDS))
def test_a_pp_reason_names_the_forwards_line_and_what_a_stage_sets_to_none(cli_runner, tmp_path, case):
    forward, line, missing = FORWARDS[case]
    source = ENCODER.replace("{forward}", textwrap.dedent(forward).strip("\n").replace("\n", "\n        ")
                             .join(["        ", ""]))
    path = tmp_path / "tied.py"
    path.write_text(source)
    lineno = source.splitlines().index(f"        {line}") + 1
    said = (f"Enc.forward does not skip the layers another stage holds: line {lineno} of tied.py, `{line}`, "
            f"{missing} (TypeError: 'NoneType' object is not callable); on a pipeline stage the blocks it does "
            "not hold are None, and so are emb, pos (before the blocks) on every stage but the first and ln, out "
            "(after the blocks) on every stage but the last; skip None layers in forward")
    profiled = cli_runner.invoke(cli, ["profile", str(path), "--no-cache"])
    assert profiled.exit_code == 0, profiled.output
    assert f"pp will not be offered: {said}" in profiled.output, profiled.output
    run = cli_runner.invoke(cli, ["execute", "pp=2,mbs=1,gbs=2", "--model", str(path), "-o", str(tmp_path / "r")])
    assert run.exit_code == 2 and f"pp=2: {said}" in run.output, run.output  # the executor's probe says the same


PYRAMID = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.fc = nn.Linear(cin, cout)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(4, 8), Block(8, 16), Block(16, 32), Block(32, 64))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        for b in self.blocks:
            if b is not None:
                x = b(x)
        return self.head(x) if self.head is not None else x


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(micro_batch_size, 4, generator=g), torch.randint(0, 10, (micro_batch_size,), generator=g)
'''
DIFFER = ("the Block modules blocks.0 | blocks.1 | blocks.2 | blocks.3 are not all alike: repeated blocks sit side "
          "by side and share their submodules and parameter shapes, e.g. blocks.1.fc.weight is (16, 8), "
          "blocks.0.fc.weight (8, 4)")


def test_a_pyramid_of_one_class_says_which_blocks_differ(cli_runner, tmp_path):
    path = tmp_path / "pyramid.py"
    path.write_text(PYRAMID)
    why = profile_model(str(path), cache=False).unsupported["pp"]
    assert why == f"Net has 1 repeated block(s); pipeline stages need at least 2: {DIFFER}"
    planned = cli_runner.invoke(cli, ["plan", str(path), "--hw", "a100x8", "--fix", "pp=2"])
    assert planned.exit_code == 2 and f"pp=2: Net has 1 repeated block(s); pipeline stages need at least 2: {DIFFER}" \
        in planned.output, planned.output
    run = cli_runner.invoke(cli, ["execute", "pp=2,mbs=1,gbs=2", "--model", str(path), "-o", str(tmp_path / "r")])
    assert run.exit_code == 2, run.output
    assert f"2 pipeline stages need at least 2 blocks but the model has 1: {DIFFER}; lower pp" in run.output


def test_alike_runs_and_other_submodules_are_named():
    from smplan.model.structure import unlike_blocks

    class Block(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.fc = nn.Linear(cin, cout)
            self.short = nn.Linear(cin, cout) if cin != cout else nn.Identity()

    # 1..2 alike (the run), 3 narrower, 0 with another shortcut: a submodule's class is named
    # rather than the parameters only it holds
    layers = nn.ModuleList([Block(8, 8), Block(8, 8), Block(8, 8), Block(8, 4)])
    layers[0].short = nn.Linear(8, 8)
    model = nn.Module()
    model.layers = layers
    layout = find_layout(model)
    assert layout.block_names == ("1", "2")
    said = unlike_blocks(model, layout)
    assert said.startswith("the Block modules layers.0 | layers.1..2 | layers.3 are not all alike"), said
    assert said.endswith("layers.1.short is Identity, layers.0.short Linear"), said
    same = nn.ModuleList([Block(8, 8), Block(8, 8)])
    holder = nn.Module()
    holder.layers = same
    assert unlike_blocks(holder, find_layout(holder)) is None  # every Block is in the run
    # another class between alike blocks ends their run too (find_blocks' rule): 0 and 2 are not one
    # run with 1..2, and only the Blocks are named (it said "0..3 are all Block" of a mixed list)
    mixed = nn.Module()
    mixed.layers = nn.ModuleList([Block(8, 8), nn.ReLU(), Block(8, 8), Block(8, 8), Block(8, 4)])
    said = unlike_blocks(mixed, find_layout(mixed))
    assert said.startswith("the Block modules layers.0 | layers.2..3 | layers.4 are not all alike"), said


ATTRS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.b0, self.b1, self.b2 = Block(8), Block(8), Block(8)
        self.out = nn.Linear(8, 10)

    def forward(self, x):
        return self.out(self.b2(self.b1(self.b0(self.inp(x)))))


def model():
    return Net()


def batch(micro_batch_size, model=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(micro_batch_size, 4, generator=g), torch.randint(0, 10, (micro_batch_size,), generator=g)
'''


def test_profile_warns_of_a_model_plan_and_execute_refuse(cli_runner, tmp_path):
    from smplan.planner.plan import no_blocks_reason

    path = tmp_path / "attrs.py"
    path.write_text(ATTRS)
    refusal = blocks_problem(profile_model(str(path), cache=False))
    assert "structurally identical modules: one class, with the same submodules and parameter shapes" in refusal
    planned = cli_runner.invoke(cli, ["plan", str(path), "--hw", "a100x8"])
    assert planned.exit_code == 2 and planned.output.strip().splitlines()[-1] == f"error: {refusal}"
    run = cli_runner.invoke(cli, ["execute", "dp=1,mbs=1,gbs=1", "--model", str(path), "-o", str(tmp_path / "r")])
    assert run.exit_code == 2 and run.output.strip().splitlines()[-1] == f"error: {no_blocks_reason('the model')}"
    # a plan file given this model with --model reaches execute's own checks: plan's line there too
    # (they said "use pp=1" of a dp-only plan, which is refused as well); nothing is written
    plan_file = tmp_path / "tiny.json"
    assert cli_runner.invoke(cli, ["plan", "examples/gpt.py:tiny", "--hw", "a100x8", "-o", str(plan_file)]).exit_code == 0
    from_file = cli_runner.invoke(cli, ["execute", str(plan_file), "--model", str(path), "-o", str(tmp_path / "f")])
    errors = [line for line in from_file.output.splitlines() if line.startswith("error:")]  # after the model-swap note
    assert from_file.exit_code == 2 and errors == [from_file.output.strip().splitlines()[-1]], from_file.output
    assert errors == [f"error: {no_blocks_reason('attrs.py')}"]  # plan's line, not "use pp=1"
    assert "Traceback" not in from_file.output and not (tmp_path / "f").exists()
    profiled = cli_runner.invoke(cli, ["profile", str(path)])
    assert profiled.exit_code == 0, profiled.output
    warning = f"warning: plan and execute will refuse this model: {refusal}"
    assert warning in profiled.stderr.splitlines() and warning not in profiled.stdout
    data = json.loads(cli_runner.invoke(cli, ["profile", str(path), "--json"]).stdout)
    assert data["notes"] == [warning]
    gpt = json.loads(cli_runner.invoke(cli, ["profile", "examples/gpt.py:tiny", "--json"]).stdout)
    assert gpt["notes"] == []


def test_the_throughput_unit_follows_the_plans_rule(capsys, tmp_path):
    from smplan.executor.metrics import rate_key

    assert rate_key(None, 1) == "samples_per_s"  # an image or feature model: plan's samples/s column
    assert rate_key(None, 16) == rate_key(64, 1) == "tokens_per_s"
    record = {"step": 2, "loss": 2.0, "step_time_s": 0.5, "tokens_per_s": 32.0, "samples_per_s": 32.0,
              "grad_norm": 1.0, "peak_memory_gib": 0.3}
    progress(record, 3, "samples_per_s")
    assert " 32 samples/s " in capsys.readouterr().out
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({**record, "step": i}) + "\n" for i in (1, 2)))
    plan = Plan(model="m.py", hw="local", nodes=1)
    summary = summarize(tmp_path, {"step_time_s": 0.25, "tokens_per_s": 64.0, "samples_per_s": 64.0}, plan.to_dict(),
                        "cpu", rate="samples_per_s")
    assert summary["throughput_key"] == "samples_per_s"
    assert {"tokens_per_s", "samples_per_s"} <= summary["measured"].keys()  # both keys stay, as before

    from smplan.cli.execute import _echo_summary

    _echo_summary({**summary, "measured": {**summary["measured"], "final_loss": 2.0}}, plan)
    out = capsys.readouterr().out
    assert "samples_per_s    measured 32  predicted 64  ratio 0.50" in out and "tokens_per_s" not in out
    del summary["throughput_key"]  # a summary.json of an older run: tokens, as it always said
    _echo_summary({**summary, "measured": {**summary["measured"], "final_loss": 2.0}}, plan)
    assert "tokens_per_s     measured 32" in capsys.readouterr().out


def test_an_mlp_run_reports_samples_per_second(tmp_path):
    result = run_execute("dp=1,mbs=2,gbs=2", tmp_path / "run", "--steps", "2", model=str(EXAMPLES / "mlp.py"))
    assert result.returncode == 0, result.stdout[-3000:]
    steps = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and all(" samples/s " in line and "tok/s" not in line for line in steps), steps
    assert "samples_per_s    measured" in result.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["throughput_key"] == "samples_per_s"
