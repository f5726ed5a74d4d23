"""The training recipe: lr schedules (pure functions of the step) and AdamW parameter groups."""

import math

import pytest
import torch
from smplan.executor.recipe import (
    Recipe,
    RecipeError,
    apply,
    decay_start,
    lr_at,
    param_groups,
    parse_betas,
)
from torch import nn


def rates(recipe: Recipe) -> list[float]:
    return [lr_at(k, recipe) for k in range(1, recipe.total_steps + 1)]


def test_constant_with_warmup_ramps_linearly_then_holds():
    r = Recipe(lr=1.0, schedule="constant", total_steps=6, warmup_steps=4)
    assert rates(r) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert rates(Recipe(lr=0.5, total_steps=3)) == [0.5, 0.5, 0.5]


def test_cosine_peaks_after_warmup_and_ends_at_min_lr():
    r = Recipe(lr=1.0, schedule="cosine", total_steps=12, warmup_steps=2, min_lr=0.1)
    lrs = rates(r)
    assert lrs[:2] == pytest.approx([0.5, 1.0])
    assert lrs[-1] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(lrs[1:], lrs[2:], strict=False))  # strictly falling after the peak
    mid = 2 + (12 - 2) / 2  # half-way through the decay: halfway between lr and min_lr
    assert lr_at(int(mid), r) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.5)))


def test_wsd_holds_then_decays_linearly_over_the_last_fifth():
    r = Recipe(lr=1.0, schedule="wsd", total_steps=10, warmup_steps=2, min_lr=0.0)
    assert decay_start(r) == 8
    assert rates(r) == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0])
    longer = Recipe(lr=1.0, schedule="wsd", total_steps=10, decay_fraction=0.5, min_lr=0.2)
    assert rates(longer)[5:] == pytest.approx([1.0 - 0.8 * k / 5 for k in range(1, 6)])


def test_steps_outside_the_run_keep_the_end_rates():
    r = Recipe(lr=1.0, schedule="cosine", total_steps=5, min_lr=0.1)
    assert lr_at(0, r) == lr_at(1, r) and lr_at(99, r) == pytest.approx(0.1)


@pytest.mark.parametrize("bad, message", [
    (dict(lr=0), "--lr must be greater than 0"),
    (dict(lr=float("nan")), "--lr must be a finite number"),
    (dict(min_lr=2e-3), "--min-lr must be between 0 and --lr"),
    (dict(weight_decay=-1), "--weight-decay must be >= 0"),
    (dict(grad_clip=float("inf")), "--grad-clip must be a finite number"),
    (dict(grad_clip=-1), "--grad-clip must be >= 0"),
    (dict(schedule="linear"), "--lr-schedule must be one of"),
    (dict(schedule="cosine", warmup_steps=10), "--warmup-steps (10) must be below --steps (10)"),
    (dict(decay_fraction=0), "--decay-fraction must be in (0, 1]"),
    (dict(betas=(0.9, 1.0)), "--adam-betas must be two numbers in [0, 1)"),
])
def test_bad_settings_are_one_line(bad, message):
    with pytest.raises(RecipeError, match=None) as err:
        Recipe(**{"total_steps": 10, **bad}).check()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_betas_parse():
    assert parse_betas("0.9,0.95") == (0.9, 0.95)
    for text in ("0.9", "a,b", "0.9,0.95,0.99"):
        with pytest.raises(RecipeError, match="--adam-betas must be B1,B2"):
            parse_betas(text)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.rms = nn.RMSNorm(4)
        self.scale = nn.Parameter(torch.ones(4))


def test_two_groups_no_decay_on_norms_biases_and_vectors():
    model = Tiny()
    groups, decayed = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed == [True, False]
    assert sorted(names[id(p)] for p in groups[0]["params"]) == ["embed.weight", "fc.weight"]
    assert sorted(names[id(p)] for p in groups[1]["params"]) == ["fc.bias", "norm.bias", "norm.weight",
                                                                 "rms.weight", "scale"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]


def test_a_model_of_matrices_only_gets_one_group():
    groups, decayed = param_groups(nn.Linear(3, 3, bias=False), 0.1)
    assert decayed == [True] and len(groups) == 1


def test_apply_sets_lr_betas_and_decay_and_the_step_decays_only_matrices():
    model = Tiny()
    groups, decayed = param_groups(model, 0.5)
    opt = torch.optim.AdamW(groups, lr=1.0)
    r = Recipe(lr=0.2, schedule="cosine", total_steps=4, warmup_steps=1, weight_decay=0.5, betas=(0.8, 0.9))
    for group in opt.param_groups:  # as a checkpoint of another recipe would have left them
        group["weight_decay"], group["lr"] = 9.0, 9.0
    assert apply(opt, 1, r, decayed) == pytest.approx(0.2)
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in opt.param_groups] == [
        (pytest.approx(0.2), (0.8, 0.9), 0.5), (pytest.approx(0.2), (0.8, 0.9), 0.0)]
    # zero gradients: AdamW's only change is the decoupled decay, lr * wd * w, on decayed params
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    after = dict(model.named_parameters())
    assert torch.allclose(after["fc.weight"], before["fc.weight"] * (1 - 0.2 * 0.5))
    assert torch.equal(after["norm.weight"], before["norm.weight"])
    assert torch.equal(after["fc.bias"], before["fc.bias"])


def test_grad_clip_zero_only_measures_the_norm():
    from smplan.executor.train import clip_grad_norm_

    params = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2))]
    params[0].grad, params[1].grad = torch.full((3,), 2.0), torch.full((2, 2), 2.0)  # norm sqrt(7*4)
    assert clip_grad_norm_(params, 0.0).item() == pytest.approx(math.sqrt(28))
    assert torch.equal(params[0].grad, torch.full((3,), 2.0))
    clip_grad_norm_(params, 1.0)
    total = torch.sqrt(sum((p.grad ** 2).sum() for p in params))
    assert total.item() == pytest.approx(1.0, rel=1e-4)
