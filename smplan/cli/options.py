"""Options shared by several commands, and their conversion to library objects."""

from __future__ import annotations

import importlib
import json

import click

from smplan.hwprofiles import DEFAULT_STACK, Cluster, bundled_stacks, load_cluster
from smplan.planner import parse_model_args
from smplan.planner.plan_schema import MAX_GLOBAL_BATCH, MAX_NODES, MAX_SEQ_LEN

# The ranges of --nodes, --global-batch and --seq-len: a value past them is a typo, refused in one
# line before the search would hang on it (planner/plan_schema.py says why each bound).
NODES = click.IntRange(min=1, max=MAX_NODES)
GLOBAL_BATCH = click.IntRange(min=1, max=MAX_GLOBAL_BATCH)
SEQ_LEN = click.IntRange(min=1, max=MAX_SEQ_LEN)


def stack_option(fn=None, *, plan_files: bool = False):
    """`--stack NAME|PATH`: the software stack (hwprofiles/stack.py). `plan_files`: the command
    also takes a plan file, whose own stack is then the default."""
    if fn is None:
        return lambda f: stack_option(f, plan_files=plan_files)
    default = f"a plan file's stack, else {DEFAULT_STACK}" if plan_files else DEFAULT_STACK
    return click.option(
        "--stack",
        default=None,
        metavar="NAME|PATH",
        help="Software stack: what the training framework, not the GPU, decides (host launch time per layer "
             "and per MoE layer, kernel fusion, fused attention kernel, ZeRO-3 gather cap, how sharded-DP "
             "collectives cross nodes and ZeRO-1/2 step them, TP-comm and MoE all-to-all overlap, the MoE "
             "dispatcher, context parallelism's K/V exchange, pipeline sends, DP gradient-reduce overlap and dtype, "
             "what sequence parallelism and the loss keep). A bundled name "
             f"({', '.join(bundled_stacks())}; smplan stack list) or a path to a .toml file. "
             f"Default: {default}. --hw-set efficiency.KEY=... still wins.",
    )(fn)


def hw_options(required: bool = True, default: str | None = None, plan_files: bool = False):
    """`--hw NAME|PATH`, `--stack NAME|PATH`, `--nodes N`, `--hw-set key=value` (repeatable);
    `plan_files`: the command also takes a plan file (its stack is --stack's default)."""

    def decorate(fn):
        fn = click.option(
            "--hw-set",
            "hw_set",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override a hardware value, dotted key (e.g. inter_node.bandwidth_gbps=50). Repeatable.",
        )(fn)
        fn = click.option("--nodes", type=NODES, default=None, help="Number of nodes (overrides the profile).")(fn)
        fn = stack_option(fn, plan_files=plan_files)
        # no default= at all when there is none: click 8.2+ takes an explicit default=None as a
        # default, and a required option with a default is never reported missing
        fallback = {"default": default, "show_default": True} if default is not None else {}
        fn = click.option(
            "--hw",
            required=required and default is None,
            metavar="NAME|PATH",
            help="Hardware profile: a bundled name (smplan hw list) or a path to a .toml file.",
            **fallback,
        )(fn)
        return fn

    return decorate


def model_args_option(fn):
    return click.option(
        "--arg",
        "model_args",
        multiple=True,
        metavar="KEY=VALUE",
        help="Keyword argument for the model builder (int/float/bool/str). Repeatable.",
    )(fn)


def json_option(fn=None, *, help: str = "Print one JSON object instead of the text output (for scripts)."):
    """--json; `help` where a verb's own words say it better (@json_option(help=...))."""
    if fn is None:
        return lambda f: json_option(f, help=help)
    return click.option("--json", "as_json", is_flag=True, help=help)(fn)


def cluster_from(hw: str, nodes: int | None, hw_set: tuple[str, ...], stack: str | None = None) -> Cluster:
    return load_cluster(hw, nodes=nodes, overrides=list(hw_set), stack=stack)


def model_args_from(items: tuple[str, ...]) -> dict:
    return parse_model_args(items)


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=_json_default))


def _json_default(obj):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, set | tuple):
        return list(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


class OneSpelling(click.Option):
    """An option that also accepts its old spellings (`old_names`) but shows only the
    current one in --help, so that each option has one name across verbs."""

    def __init__(self, *args, old_names: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.old_names = tuple(old_names)

    def get_help_record(self, ctx):
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.old_names]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


def imported_constant(ref: str):
    """The constant "package.module:NAME" names (the spelling of main.COMMANDS), its module imported now."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


class LazyConstantOption(click.Option):
    """An option whose default (`default_from`) or environment variable (`envvar_from`) is a
    constant of a module that imports torch, named "package.module:NAME" and read the first time
    the option needs it (the command parses its arguments or shows its --help), not when the
    command's module loads: `smplan --help` reads every command's first line without torch."""

    def __init__(self, *args, default_from: str | None = None, envvar_from: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.default_from, self.envvar_from = default_from, envvar_from

    def get_default(self, ctx, call=True):
        if self.default_from is not None:
            self.default, self.default_from = imported_constant(self.default_from), None
        return super().get_default(ctx, call=call)

    def resolve_envvar_value(self, ctx):
        if self.envvar_from is not None:
            self.envvar, self.envvar_from = imported_constant(self.envvar_from), None
        return super().resolve_envvar_value(ctx)


class FaultHookOption(LazyConstantOption):
    """A hidden option read from its environment variable (fault injection for the tests): a bad
    value is named by the variable the user set, not by the option --help does not show."""

    def get_error_hint(self, ctx) -> str:
        if ctx.get_parameter_source(self.name) == click.core.ParameterSource.ENVIRONMENT:
            return f"${self.envvar} (a test hook; unset it for a real run)"
        return super().get_error_hint(ctx)


def warn_about_profiles(*profiles: str | None, stack: str | None = None, overrides: dict | None = None,
                        varied: dict[str, tuple] | None = None, stacks: tuple[str, ...] = ()) -> list[str]:
    """Say on stderr when a profile (name or path) has never been calibrated, name its values,
    the `--hw-set` `overrides` on it and the `whatif --vary` hardware values in `varied`
    (dotted key -> values) that look like another unit (hwprofiles.plausible), the same of the
    stack `stack` and the swept `stacks`, and the efficiency values of its own that `stack` replaces.
    Returns those lines, for --json's notes."""
    from smplan.hwprofiles import implausible_values, replaced_by_stack, uncalibrated_warning
    from smplan.hwprofiles.plausible import implausible_varied
    from smplan.hwprofiles.stack import implausible_stack_values

    notes: list[str | None] = []
    for name in dict.fromkeys(p for p in profiles if p):
        notes += [uncalibrated_warning(name), *implausible_values(name, overrides), replaced_by_stack(name, stack)]
        for key, values in (varied or {}).items():
            notes += implausible_varied(name, overrides or {}, key, values)
    for name in dict.fromkeys((stack, *stacks)):
        notes += implausible_stack_values(name)
    said = [note for note in dict.fromkeys(notes) if note]
    for note in said:
        click.echo(note, err=True)
    return said


def given_on_command_line(name: str) -> bool:
    """Whether the running command's option `name` (its parameter name) was typed, not its default."""
    return click.get_current_context().get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


# The keys of an inline plan (planner.plan.INLINE_KEYS, short names), for the --help of the commands
# that take one; `smplan plan --help`'s --fix says what each means.
INLINE_PLAN_KEYS = ("tp, pp, dp, ep, cp, mbs, gbs (the global batch), zero, recompute, schedule, v, sp, overlap_dp, "
                    "dtype (bf16, fp8, ...), cf, grad_compress, fp8_scaling, stages; smplan plan --help's --fix "
                    "explains them, smplan simulate --help's --plan stages")

dtype_option = click.option(
    "--dtype", type=click.Choice(["bf16", "fp16", "fp32", "fp8"]), default=None,
    help="Training dtype (default: bf16, or fp16 on GPUs without a bf16 peak such as V100, fp32 on a CPU "
         "profile from `smplan hw probe`, as execute runs there; fp8: FP8 linears, bf16 elsewhere, on GPUs "
         "with an fp8 peak).")


def non_empty_path(ctx, param, value):
    """click callback of an output path option: `-o "$OUT"` with OUT unset gives "", which was
    taken for no path (nothing written) or for the current folder, without a word."""
    if value is not None and not str(value).strip():
        or_not = "" if isinstance(param, click.Argument) else ", or leave the option out"
        raise click.BadParameter(f"an empty path (an unset shell variable?); give a path{or_not}", ctx=ctx, param=param)
    return value
