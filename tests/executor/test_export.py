"""`smplan export` in one process: a run directory whose DCP checkpoint is written by the
executor's own `checkpoint.save` (no process group: DCP's single-process path), exported and
loaded back with transformers' `from_pretrained`; the same logits. Errors through CliRunner.
One 2-process tp=2 run counts what each rank reads of an exported folder: its shards."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from smplan.executor import checkpoint
from smplan.executor.config import RunConfig
from smplan.executor.export import export_run
from smplan.executor.init_from import InitFromError, check_source, open_source
from smplan.executor.run import resolve_plan

from smplan.cli.main import cli
from tests.executor.gloo_group import gloo_group
from tests.executor.runs import GPT_TINY

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            intermediate_size=128, max_position_embeddings=16)


def make_run(tmp_path, ref: str, name: str = "run", steps=(1,)):
    """A run directory as `smplan execute --checkpoint-every` leaves it, of a randomly
    initialised model after one AdamW step; returns (run_dir, the model)."""
    import warnings

    plan, model_file = resolve_plan("mbs=1,gbs=1", model=ref)
    torch.manual_seed(0)
    model = model_file.build(plan.model_args, device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 128, (2, 16))
    model(x).logits.sum().backward()
    opt.step()
    run = tmp_path / name
    ckpt = run / "checkpoints"
    RunConfig(plan=plan.replace(model=model_file.absolute_ref).to_dict(), model_ref=model_file.absolute_ref,
              out_dir=str(run), checkpoint_dir=str(ckpt)).save(run.mkdir() or run / "run_config.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in a single process"
        for step in steps:
            checkpoint.save(ckpt, step, [model], [opt], {"model": model_file.absolute_ref}, 0, lambda: None)
    return run, model


def logits(model, seed=1):
    x = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(x).logits


@pytest.fixture
def llama(tmp_path):
    folder = tmp_path / "llama"
    transformers.LlamaConfig(**TINY).save_pretrained(folder)
    return f"hf:{folder}"


@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_with_the_same_logits(tmp_path, tied):
    folder = tmp_path / "llama"
    transformers.LlamaConfig(**TINY, tie_word_embeddings=tied).save_pretrained(folder)
    run, model = make_run(tmp_path, f"hf:{folder}")
    out = tmp_path / "hf"
    result = export_run(run, out)
    assert result.step == 1 and result.files == ["model.safetensors", "config.json"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(loaded) is type(model) and loaded.dtype == torch.float32
    assert loaded.config.tie_word_embeddings == tied and loaded.config.num_hidden_layers == 2
    if tied:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
        assert result.tensors == len(dict(model.named_parameters()))  # the tied pair written once
    torch.testing.assert_close(logits(loaded.eval()), logits(model.eval()))


FAMILIES = {  # transformers 5 fuses Mixtral's experts in its state dict; GPT-2 ties its head (Conv1D layers)
    "mixtral": lambda: transformers.MixtralConfig(**{**TINY, "intermediate_size": 32}, num_local_experts=4,
                                                  num_experts_per_tok=2),
    "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=16,
                                            bos_token_id=0, eos_token_id=0),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_other_families_round_trip(tmp_path, family):
    FAMILIES[family]().save_pretrained(tmp_path / family)
    run, model = make_run(tmp_path, f"hf:{tmp_path / family}")
    export_run(run, tmp_path / "hf")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(logits(loaded.eval()), logits(model.eval()))
    check_source(open_source(tmp_path / "hf"), model)  # and --init-from takes the folder


def test_big_exports_are_sharded_with_an_index(tmp_path, llama):
    run, model = make_run(tmp_path, llama)
    out = tmp_path / "hf"
    result = export_run(run, out, max_shard_gib=40_000 / 2**30)  # ~40 kB a file: several files
    shards = [f for f in result.files if f.endswith(".safetensors")]
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert index["metadata"]["total_size"] == result.total_size_bytes == sum(
        t.numel() * t.element_size() for t in model.state_dict().values())
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits(loaded.eval()), logits(model.eval()))
    # the folder --init-from reads: the same names and shapes as the model (headers only)
    source = open_source(out)
    assert source.kind == "safetensors"
    check_source(source, model)


def test_step_picks_a_checkpoint(tmp_path, llama, cli_runner):
    run, _ = make_run(tmp_path, llama, steps=(2, 5))
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "a"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["step"] == 5
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "b"), "--step", "2", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["step"] == 2
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "c"), "--step", "3"])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        f"error: {run} has no checkpoint of step 3; it has steps 2, 5"]


def test_out_dir_is_kept_without_force(tmp_path, llama, cli_runner):
    run, model = make_run(tmp_path, llama)
    out = tmp_path / "hf"
    assert cli_runner.invoke(cli, ["export", str(run), str(out), "--max-shard-gib", str(40_000 / 2**30)]).exit_code == 0
    before = sorted(p.name for p in out.iterdir())
    result = cli_runner.invoke(cli, ["export", str(run), str(out)])
    assert result.exit_code == 2 and "not empty; pass --force" in result.output and "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == before
    result = cli_runner.invoke(cli, ["export", str(run), str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no stale shard left
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits(loaded.eval()), logits(model.eval()))


def test_files_get_the_umask_mode_and_a_run_folder_is_never_written(tmp_path, llama, cli_runner):
    import os
    import stat

    run, _ = make_run(tmp_path, llama)
    out = tmp_path / "hf"
    umask = os.umask(0o022)
    try:
        assert cli_runner.invoke(cli, ["export", str(run), str(out)]).exit_code == 0
    finally:
        os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}  # safetensors alone wrote 0600
    before = sorted(p.name for p in run.rglob("*"))
    for force in ([], ["--force"]):
        result = cli_runner.invoke(cli, ["export", str(run), str(run), *force])
        assert result.exit_code == 2 and result.output.strip().splitlines() == [
            f"error: {run} holds a run (run_config.json); export into a new folder, e.g. {run}/hf"]
        step = run / "checkpoints" / "step-1"
        result = cli_runner.invoke(cli, ["export", str(run), str(step), *force])
        assert result.exit_code == 2 and "is inside the run's checkpoints/, which its resumes read" in result.output
    assert sorted(p.name for p in run.rglob("*")) == before
    mine = tmp_path / "mine"  # a folder that merely holds a subfolder named like a run's is no run
    (mine / "checkpoints").mkdir(parents=True)
    assert cli_runner.invoke(cli, ["export", str(run), str(mine), "--force"]).exit_code == 0


def test_user_errors_are_one_line(tmp_path, llama, cli_runner):
    cases = {
        "missing": ([str(tmp_path / "nope"), str(tmp_path / "o1")], "does not exist"),
        "not a run": ([str(tmp_path), str(tmp_path / "o2")], "is not a run directory of smplan execute"),
        "no checkpoint": ([str(tmp_path / "ran"), str(tmp_path / "o3")], "holds no complete checkpoint"),
        "torn config": ([str(tmp_path / "torn"), str(tmp_path / "o4")], "is not a run's JSON config"),
    }
    (tmp_path / "ran").mkdir()
    (tmp_path / "ran" / "run_config.json").write_text("{}")
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run_config.json").write_text("{")
    for what, (args, text) in cases.items():
        result = cli_runner.invoke(cli, ["export", *args])
        assert result.exit_code == 2, (what, result.output)
        assert len(result.output.strip().splitlines()) == 1 and text in result.output, (what, result.output)
    run, _ = make_run(tmp_path, llama)
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "missing" / "out")])
    assert result.exit_code == 2 and "does not exist; create it first" in result.output


def test_models_without_a_transformers_class_are_refused(tmp_path, cli_runner):
    import warnings

    plan, model_file = resolve_plan("mbs=1,gbs=1", model=GPT_TINY)
    model = model_file.build(plan.model_args, device="cpu")
    opt = torch.optim.AdamW(model.parameters())
    run = tmp_path / "run"
    RunConfig(plan=plan.to_dict(), model_ref=model_file.absolute_ref, out_dir=str(run),
              checkpoint_dir=str(run / "checkpoints")).save(run.mkdir() or run / "run_config.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        checkpoint.save(run / "checkpoints", 1, [model], [opt], {}, 0, lambda: None)
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "out")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "export needs a Hugging Face model" in result.output and "GPT" in result.output


def test_model_file_returning_a_pretrained_model_exports(tmp_path):
    path = tmp_path / "llama_file.py"
    path.write_text(textwrap.dedent(f"""
        from transformers import LlamaConfig, LlamaForCausalLM

        def model(layers: int = 2):
            return LlamaForCausalLM(LlamaConfig(**{{**{TINY!r}, "num_hidden_layers": layers}}))
    """))
    run, model = make_run(tmp_path, str(path))
    out = tmp_path / "hf"
    export_run(run, out)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits(loaded.eval()), logits(model.eval()))


def test_init_from_mismatches_are_one_line(tmp_path, llama):
    run, _ = make_run(tmp_path, llama)
    out = tmp_path / "hf"
    export_run(run, out)
    other = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 3}))
    with pytest.raises(InitFromError, match="lacks 9 of the model's tensors .first: model.layers.2"):
        check_source(open_source(out), other)
    wider = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**TINY, "vocab_size": 256}))
    with pytest.raises(InitFromError, match=r"has model.embed_tokens.weight as \(128, 64\), where the model has \(256, 64\)"):
        check_source(open_source(out), wider)
    fewer = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 1}))
    with pytest.raises(InitFromError, match="tensors the model lacks .first: model.layers.1"):
        check_source(open_source(out), fewer)
    # a DCP checkpoint (step folder, checkpoint root or run directory) reads the same way
    for path in (run, run / "checkpoints", run / "checkpoints" / "step-1"):
        source = open_source(path)
        assert source.kind == "dcp" and source.path.endswith("step-1")
    with pytest.raises(InitFromError, match="holds neither"):
        open_source(tmp_path / "llama")
    with pytest.raises(InitFromError, match="does not exist"):
        open_source(tmp_path / "nope")


def test_execute_refuses_other_weights_before_launch(tmp_path, llama, cli_runner):
    run, _ = make_run(tmp_path, llama)
    out = tmp_path / "hf"
    export_run(run, out)
    execute = ["execute", "mbs=1,gbs=1", "--model", llama, "--steps", "1", "-o", str(tmp_path / "new")]
    result = cli_runner.invoke(cli, [*execute, "--arg", "num_hidden_layers=3", "--init-from", str(out)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "lacks 9 of the model's tensors (first: model.layers.2" in result.output
    assert not (tmp_path / "new").exists()  # refused before the run directory was made
    result = cli_runner.invoke(cli, [*execute, "--init-from", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "--init-from" in result.output and "does not exist" in result.output


def _read_worker(rank: int, world: int, spec: str, ref: str, folder: str, init_file: str) -> None:
    """Fill tp=2 shards from `folder`, counting the elements safetensors hands out."""
    import safetensors
    from safetensors.torch import load_file
    from smplan.executor.build import build_model_parts
    from smplan.executor.init_from import load_weights
    from smplan.executor.mesh import ParallelDims

    read = []
    original = safetensors.safe_open

    class Counting:  # safe_open whose slices report how many elements they hand out
        def __init__(self, *args, **kwargs):
            self.file = original(*args, **kwargs)

        def __enter__(self):
            self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def get_slice(self, name):
            part = self.file.get_slice(name)

            class Sliced:
                def __getattr__(self, attr):  # get_shape, get_dtype
                    return getattr(part, attr)

                def __getitem__(self, index):
                    tensor = part[index]
                    read.append(tensor.numel())
                    return tensor

            return Sliced()

    safetensors.safe_open = Counting
    with gloo_group(init_file, rank, world):
        plan, model_file = resolve_plan(spec, model=ref)
        dims = ParallelDims(plan.pp, plan.dp, plan.tp, world)
        dims.build_mesh("cpu")
        parts = build_model_parts(plan, model_file, dims, torch.device("cpu"), seed=3, loss_fn=None)
        load_weights(parts.chunks, open_source(folder))
        expected = load_file(f"{folder}/model.safetensors")
        local = 0
        for name, tensor in parts.chunks[0].state_dict().items():
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            assert torch.equal(full, expected[name]), name
            local += tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()
        total = sum(t.numel() for t in expected.values())
        assert sum(read) == local < 0.6 * total, (sum(read), local, total)  # its shards, not the model


def test_each_tp_rank_reads_only_its_slices(tmp_path, llama):
    import time

    import torch.multiprocessing as mp

    run, _ = make_run(tmp_path, llama)
    export_run(run, tmp_path / "hf")
    ctx = mp.start_processes(_read_worker, args=(2, "tp=2,mbs=1,gbs=1", llama, str(tmp_path / "hf"),
                                                 str(tmp_path / "init")), nprocs=2, start_method="spawn", join=False)
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "workers ran past 120 s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def test_without_the_hf_extra_export_says_what_to_install(tmp_path, llama, cli_runner, monkeypatch):
    run, _ = make_run(tmp_path, llama)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)  # as if `pip install smplan` alone
    result = cli_runner.invoke(cli, ["export", str(run), str(tmp_path / "out")])
    assert result.exit_code == 2 and result.output.strip().splitlines() == [
        "error: smplan export needs safetensors.torch: pip install 'smplan[hf]'"], result.output
