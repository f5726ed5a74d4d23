"""Every broken model file ends in one ModelFileError line naming the file and the fix."""

from __future__ import annotations

import textwrap

import pytest
from smplan.planner import ModelFileError, load_model_file, parse_model_args, profile_model

from tests.conftest import EXAMPLES

GOOD_TAIL = """
import torch
from torch import nn

def batch(n, model=None):
    return torch.randn(n, 4), None
"""

BROKEN = {
    "syntax": ("def model(:\n    pass\n", {}, "syntax error on line 1"),
    "import": ("import not_a_module_smplan\n", {}, "No module named"),
    "no_builder": (GOOD_TAIL + "def other():\n    return nn.Linear(4, 4)\n", {}, "no builder function 'model'"),
    "not_module": (GOOD_TAIL + "def model():\n    return 42\n", {}, "returned int, not a torch.nn.Module"),
    "wrong_type": (GOOD_TAIL + "def model(width: int = 4):\n    return nn.Linear(4, width)\n", {"width": "wide"},
                   "--arg width must be a whole number"),
    "unknown_arg": (GOOD_TAIL + "def model(width: int = 4):\n    return nn.Linear(4, width)\n", {"depth": 3},
                    "takes no argument 'depth'"),
    "near_builder": (GOOD_TAIL + "def model_7b():\n    return nn.Linear(4, 4)\n", {},
                     "no builder function 'model' (did you mean 'model_7b'?)"),
    "near_arg": (GOOD_TAIL + "def model(width: int = 4):\n    return nn.Linear(4, width)\n", {"widht": 3},
                 "takes no argument 'widht' (did you mean 'width'?); it takes: width"),
    "builder_crash": (GOOD_TAIL + "def model():\n    raise RuntimeError('boom')\n", {}, "raised RuntimeError: boom"),
    "no_batch": ("from torch import nn\ndef model():\n    return nn.Linear(4, 4)\n", {}, "no batch() function"),
    "forward_crash": (GOOD_TAIL + textwrap.dedent("""
        class Net(nn.Module):
            def forward(self, x):
                return x.sum().item()

        def model():
            return Net()
    """), {}, "forward raised"),
    "forward_item_on_meta": (GOOD_TAIL + textwrap.dedent("""
        class Net(nn.Module):
            def forward(self, x):
                return x * x.sum().item()

        def model():
            return Net()
    """), {}, "the profiler runs it on the meta device (no data): avoid .item()"),
    "loss_shape": (textwrap.dedent("""
        import torch
        from torch import nn
        import torch.nn.functional as F

        def batch(n, model=None):
            return torch.randn(n, 4), torch.randn(n, 3)

        def model():
            return nn.Linear(4, 10)

        def loss(out, targets):
            return F.cross_entropy(out, targets.argmax(-1, keepdim=True))
    """), {}, "loss raised AssertionError"),
}


def test_profile_says_a_loss_mismatch_in_one_line_exit_2(cli_runner, tmp_path):
    from smplan.cli.main import cli

    path = tmp_path / "loss_shape.py"
    path.write_text(BROKEN["loss_shape"][0])
    before = path.read_text()
    result = cli_runner.invoke(cli, ["profile", str(path)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "it was given [1, 10] from forward and [1, 3] from batch()'s targets" in lines[0]
    assert path.read_text() == before


def test_a_plain_loss_mismatch_names_the_shapes_not_the_meta_device(tmp_path):
    """A loss given targets of the wrong shape fails on real data too: the line says what it was
    given, not that the meta device has no data (a review's finding)."""
    path = tmp_path / "loss_shape.py"
    path.write_text(BROKEN["loss_shape"][0])
    with pytest.raises(ModelFileError) as info:
        profile_model(str(path), {}, cache=False)
    message = str(info.value)
    assert "it was given [1, 10] from forward and [1, 3] from batch()'s targets" in message, message
    assert "meta device" not in message


@pytest.fixture(params=sorted(BROKEN))
def broken(request, tmp_path):
    source, args, expected = BROKEN[request.param]
    path = tmp_path / f"{request.param}.py"
    path.write_text(source)
    return path, args, expected


def test_broken_file_gives_one_line_naming_file_and_problem(broken):
    path, args, expected = broken
    with pytest.raises(ModelFileError) as info:
        profile_model(str(path), args, cache=False)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    assert expected in message


def test_missing_file_and_not_python(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model_file(str(tmp_path / "nope.py"))
    (tmp_path / "model.txt").write_text("")
    with pytest.raises(ModelFileError, match="not a .py file"):
        load_model_file(str(tmp_path / "model.txt"))
    (tmp_path / "mine.py").write_text("")  # the .py left out: the error names the file that is there
    with pytest.raises(ModelFileError, match=f"does not exist; did you mean {tmp_path / 'mine.py'}:tiny\\?$"):
        load_model_file(f"{tmp_path / 'mine'}:tiny")
    with pytest.raises(ModelFileError, match=f"did you mean {tmp_path / 'mine.py'}\\?$"):
        load_model_file(str(tmp_path / "mine"))
    with pytest.raises(ModelFileError, match=f"did you mean {tmp_path / 'mine.py'}:tiny\\?$"):  # as Path spells it
        load_model_file(f"{tmp_path}/./mine:tiny")


def test_builder_selection_and_seq_len_check():
    mf = load_model_file(f"{EXAMPLES / 'gpt.py'}:gpt3_175b")
    assert mf.builder_name == "gpt3_175b" and len(mf.sha256) == 64
    with pytest.raises(ModelFileError, match="takes no seq_len"):
        profile_model(str(EXAMPLES / "mlp.py"), seq_len=16, cache=False)
    with pytest.raises(ModelFileError, match="must be text"):
        profile_model(str(EXAMPLES / "gpt.py"), {"attention": 3}, cache=False)


def test_parse_model_args():
    assert parse_model_args(["a=1", "b=0.5", "c=true", "d=sdpa"]) == {"a": 1, "b": 0.5, "c": True, "d": "sdpa"}
    with pytest.raises(ModelFileError, match="key=value"):
        parse_model_args(["layers"])


def test_a_torch_error_keeps_its_first_line_only(tmp_path):
    # Found by tests/fuzz/test_plan_json_fuzz.py: torch's C++ errors (here, a size past int64)
    # append a stack trace, which made the message dozens of lines.
    path = tmp_path / "big.py"
    path.write_text(GOOD_TAIL + "def model(width: int = 4):\n    return nn.Linear(4, width)\n")
    with pytest.raises(ModelFileError) as info:
        profile_model(str(path), {"width": 10**30}, cache=False)
    message = str(info.value)
    assert "\n" not in message and "model(width=" in message


def test_a_zero_size_weight_builds_without_torch_notice(tmp_path):
    # Found by tests/fuzz/test_plan_json_fuzz.py (model_args vocab=0): torch.nn.init's notice
    # printed two stray lines above the one-line error.
    import warnings

    path = tmp_path / "zero.py"
    path.write_text(GOOD_TAIL + "def model(width: int = 4):\n    return nn.Linear(4, width)\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model_file(str(path)).build({"width": 0}).weight.numel() == 0


def test_hooks_are_the_same_before_and_after_a_build(tmp_path, monkeypatch):
    """A file that builds a transformers model it imports from another file of the user's gets
    transformers' hooks (here, the causal-LM loss) whether or not it was built first: the
    launcher and the workers look hooks up in different orders."""
    pytest.importorskip("transformers")
    from smplan.planner import hf_model

    (tmp_path / "mymodels.py").write_text(textwrap.dedent("""
        from transformers import LlamaConfig, LlamaForCausalLM

        def tiny():
            return LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                num_key_value_heads=2, intermediate_size=64, vocab_size=64))
    """))
    (tmp_path / "user.py").write_text("from mymodels import tiny as model\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fresh = load_model_file(str(tmp_path / "user.py"))
    assert fresh.hook("loss") is hf_model.loss  # looked up before any build
    built = load_model_file(str(tmp_path / "user.py"))
    built.build({}, device="meta")
    assert built.hook("loss") is hf_model.loss
    assert load_model_file("examples/gpt.py:tiny").hook("data") is None  # built on meta: not a transformers model


def test_a_builders_seq_len_sets_a_transformers_models_batches(tmp_path):
    """A builder returning a PreTrainedModel with its own seq_len argument: that length, not
    the config's context (max_position_embeddings), is what batch() gives and the profile says."""
    pytest.importorskip("transformers")
    path = tmp_path / "ptm.py"
    path.write_text(textwrap.dedent("""
        from transformers import LlamaConfig, LlamaForCausalLM

        def model(layers: int = 2, seq_len: int = 32):
            return LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                                                num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                                                max_position_embeddings=128))
    """))
    assert profile_model(str(path), cache=False).seq_len == 32
    assert profile_model(str(path), args={"seq_len": 16}, cache=False).seq_len == 16


def test_a_folder_with_a_config_names_hf(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelFileError, match=f"is a folder holding a config.json; pass hf:{tmp_path} for"):
        load_model_file(str(tmp_path))


def test_a_file_training_an_encoder_on_next_tokens_is_refused(tmp_path):
    """A file returning BertLMHeadModel without batch()/loss() of its own would get hf: next-token
    batches on bidirectional attention; with both of its own (a classifier) it is its task."""
    pytest.importorskip("transformers")
    body = textwrap.dedent("""
        import torch
        import transformers as T

        def model():
            return T.BertLMHeadModel(T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=2, intermediate_size=64,
                                                  max_position_embeddings=32))
    """)
    (tmp_path / "lm.py").write_text(body)
    with pytest.raises(ModelFileError, match="BertConfig is an encoder-only model .* define batch.. and loss.. in"):
        load_model_file(str(tmp_path / "lm.py")).build({}, device="meta")
    own = body + textwrap.dedent("""
        def batch(micro_batch_size, model=None, seed=0):
            return torch.zeros(micro_batch_size, 8, dtype=torch.long), torch.zeros(micro_batch_size, dtype=torch.long)

        def loss(outputs, targets):
            return outputs.logits[:, 0].float().logsumexp(-1).mean()
    """)
    (tmp_path / "cls.py").write_text(own)
    load_model_file(str(tmp_path / "cls.py")).build({}, device="meta")
