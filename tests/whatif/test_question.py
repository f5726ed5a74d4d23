"""The what-if question's own checks: what a sweep would silently ignore is refused."""

from __future__ import annotations

import pytest

from smplan.whatif import parse_vary
from smplan.whatif.question import Question, QuestionError


def test_a_swept_hw_replaces_only_a_default_or_one_among_its_values():
    hws = (parse_vary("hw=h100x8,b200x8"),)
    Question("examples/gpt.py:tiny", varies=hws)  # --hw left at its default: the sweep names the GPUs
    Question("examples/gpt.py:tiny", hw="h100x8", hw_given=True, varies=hws)  # among them: nothing lost
    with pytest.raises(QuestionError, match="--hw a100x8 is not among --vary hw's values"):
        Question("examples/gpt.py:tiny", hw="a100x8", hw_given=True, varies=hws)


def test_a_given_hw_may_name_a_swept_profile_another_way(tmp_path, monkeypatch):
    """A path and a name of one file are one profile (a review: ./mine.toml against mine.toml, and
    the bundled file's path against its name, were refused)."""
    from smplan.hwprofiles.loader import PROFILE_DIR

    (tmp_path / "mine.toml").write_text((PROFILE_DIR / "h100x8.toml").read_text())
    monkeypatch.chdir(tmp_path)
    Question("examples/gpt.py:tiny", hw="./mine.toml", hw_given=True, varies=(parse_vary("hw=mine.toml,b200x8"),))
    Question("examples/gpt.py:tiny", hw=str(PROFILE_DIR / "h100x8.toml"), hw_given=True,
             varies=(parse_vary("hw=h100x8,b200x8"),))


def test_a_given_stack_the_sweep_leaves_out_is_refused():
    stacks = (parse_vary("stack=megatron-core,torchtitan"),)
    Question("examples/gpt.py:tiny", varies=stacks)
    Question("examples/gpt.py:tiny", stack="torchtitan", varies=stacks)
    with pytest.raises(QuestionError, match="--stack pytorch-fsdp is not among --vary stack's values"):
        Question("examples/gpt.py:tiny", stack="pytorch-fsdp", varies=stacks)


def test_fp8_on_profiles_without_an_fp8_peak_is_refused_up_front():
    """Every point was infeasible with the planner's "use dtype=bf16" (a review): one line, as plan."""
    with pytest.raises(QuestionError, match="--dtype fp8 needs FP8 tensor cores, but a100x8, v100x8 have no"):
        Question("examples/gpt.py:tiny", dtype="fp8", varies=(parse_vary("hw=a100x8,v100x8"),))
    Question("examples/gpt.py:tiny", dtype="fp8", varies=(parse_vary("hw=a100x8,h100x8"),))  # the H100 points run
    Question("examples/gpt.py:tiny", dtype="fp8", varies=(parse_vary("gpu.peak_tflops.fp8=100,200"),))  # swept in
