"""The question a what-if sweep answers: fixed inputs plus the --vary grid."""

from __future__ import annotations

from dataclasses import dataclass, field

from .grid import Vary, fmt_value

# Hardware-profile sections that a step does not read: only the failure simulation of a run does.
RUN_ONLY_SECTIONS = ("reliability", "storage")


class QuestionError(ValueError):
    """The what-if question itself is inconsistent; the message says what to change."""


@dataclass(frozen=True)
class Question:
    model: str  # "examples/gpt.py:llama3_70b"
    hw: str = "a100x8"
    hw_given: bool = False  # --hw was on the command line, not its default
    nodes: int | None = None
    hw_overrides: dict = field(default_factory=dict)  # --hw-set
    stack: str | None = None  # --stack NAME|PATH; None = the default stack (hwprofiles/stack.py)
    model_args: dict = field(default_factory=dict)  # --arg
    varies: tuple[Vary, ...] = ()
    tokens: float | None = None  # --tokens
    days: float | None = None  # --days
    plan: str | None = None  # --plan (inline form); None = re-plan every point
    global_batch: int | None = None
    # the global batch was the sweep's default (one sample per GPU of its largest point), not the user's
    global_batch_is_default: bool = False
    seq_len: int | None = None
    dtype: str | None = None  # None: each point's GPU default, as `smplan plan` picks (planner.default_dtype)
    checkpoint_interval_min: float | None = None  # None = the Young/Daly interval
    seeds: int = 30  # failure-simulation seeds per point (chosen: a whole sweep stays in seconds)
    sensitivity_delta: float = 0.2  # the tornado's ±X (chosen: a change an upgrade or a slip plausibly makes)
    command: str | None = None
    # what --tokens counts: "sample" for a model whose samples are not token sequences (an MLP, a CNN:
    # its profile's seq_len is 0), as `smplan plan` counts samples/s there; set from the profile
    unit: str = "token"

    def __post_init__(self) -> None:
        if self.tokens is not None and self.days is not None:
            raise QuestionError("give --tokens or --days, not both")
        for name in ("tokens", "days"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise QuestionError(f"--{name} must be greater than 0, got {value:g}")
        if self.seeds < 1:
            raise QuestionError(f"seeds must be at least 1, got {self.seeds}")
        if not 0 < self.sensitivity_delta < 1:
            raise QuestionError(f"the sensitivity delta must be between 0 and 1, got {self.sensitivity_delta}")
        if not self.timed and (self.checkpoint_interval_min is not None
                               or any(v.kind == "checkpoint" for v in self.varies)):
            raise QuestionError("a checkpoint interval prices checkpoints over a run: add --tokens or --days")
        # failure rates, restart and checkpoint-write times change only a whole run, not a step:
        # without one, every point of such a sweep would come out the same
        run_only = [v.key for v in self.varies if v.kind == "cluster" and v.target.split(".")[0] in RUN_ONLY_SECTIONS]
        if not self.timed and run_only:
            raise QuestionError(f"--vary {run_only[0]} changes only a whole run (failures, restarts, checkpoint "
                                "writes), not a step: add --tokens or --days")
        self._check_fixed_and_varied()
        self._check_fp8_scaling_has_fp8()
        self._check_stages_keep_their_chunks()
        self._check_fixed_inputs()  # before the swept values: a bad fixed input is not --vary's fault
        self._check_hardware_values()
        self._check_fp8_has_fp8_gpus()

    def _check_fp8_has_fp8_gpus(self) -> None:
        """A fixed fp8 (--dtype, --plan's dtype) on profiles none of which has an FP8 peak would make
        every point infeasible with the planner's "use dtype=bf16": refused up front, as `plan` does."""
        from smplan.hwprofiles import load_cluster
        from smplan.planner.plan import parse_inline

        fixed = self.dtype or (parse_inline(self.plan).get("dtype") if self.plan else None)
        swept_peak = any(v.kind == "cluster" and v.target == "gpu.peak_tflops.fp8" for v in self.varies)
        if fixed != "fp8" or swept_peak:
            return
        hws = next((v.values for v in self.varies if v.kind == "hw"), (self.hw,))
        clusters = [load_cluster(hw, nodes=self.nodes, overrides=self.hw_overrides, stack=self.stack) for hw in hws]
        if not any(c.gpu.peak_tflops.fp8 > 0 for c in clusters):
            flag, instead = ("--dtype fp8", "--dtype bf16") if self.dtype else ("--plan's dtype=fp8", "dtype=bf16 in --plan")
            raise QuestionError(f"{flag} needs FP8 tensor cores, but {', '.join(c.name for c in clusters)} "
                                f"{'has' if len(clusters) == 1 else 'have'} no gpu.peak_tflops.fp8; use {instead}, "
                                "or --hw / --vary hw= with FP8 GPUs (h100x8, b200x8)")

    def _check_hardware_values(self) -> None:
        """A swept hardware value that no swept (or the given) profile accepts, such as a negative
        bandwidth, is the user's typo, not an infeasible point: refused with the loader's rule."""
        from smplan.hwprofiles import HardwareProfileError, load_cluster, override_rule

        hws = next((v.values for v in self.varies if v.kind == "hw"), (self.hw,))
        for v in (v for v in self.varies if v.kind == "cluster"):
            for value in v.values:
                rules = []
                for hw in hws:
                    try:
                        load_cluster(hw, nodes=self.nodes, overrides={**self.hw_overrides, v.target: value})
                        break
                    except HardwareProfileError as err:  # keep the rule, not the loader's framing
                        rules.append(override_rule(err))
                else:
                    raise QuestionError(f"--vary {v.key}: {rules[0]}; give values the profile accepts")

    def _check_fixed_inputs(self) -> None:
        """--plan, --hw and --hw-set values that no point could use (tp=0, a hardware file with a
        typo, a negative bandwidth) are the user's to fix, not infeasible points: refused up front
        with the rule, as `plan` and `simulate` refuse them."""
        from smplan.hwprofiles import HardwareProfileError, load_cluster
        from smplan.planner.plan import count_problem, parse_inline

        problem = count_problem(parse_inline(self.plan)) if self.plan else None
        if problem:
            raise QuestionError(f"--plan: {problem}")
        hws = next((v.values for v in self.varies if v.kind == "hw"), (self.hw,))
        errors = []
        for hw in hws:  # one profile that takes the fixed inputs is enough: the rest are points
            try:
                load_cluster(hw, nodes=self.nodes, overrides=self.hw_overrides, stack=self.stack)
                return
            except HardwareProfileError as err:
                errors.append(str(err))
        raise QuestionError(errors[0])

    def _check_fixed_and_varied(self) -> None:
        """A setting both fixed and swept would silently take one of the two: refuse it."""
        from smplan.planner.plan import parse_inline

        plan_keys = set(parse_inline(self.plan)) if self.plan else set()
        fixed = {"nodes": ("--nodes", self.nodes),
                 "global_batch": ("--global-batch" if self.global_batch is not None else "--plan's global_batch",
                                  self.global_batch if self.global_batch is not None else plan_keys & {"global_batch"} or None),
                 "seq_len": ("--seq-len" if self.seq_len is not None else "--arg seq_len",
                             self.seq_len if self.seq_len is not None else self.model_args.get("seq_len")),
                 "checkpoint": ("--checkpoint-interval-min", self.checkpoint_interval_min)}
        for v in self.varies:
            flag, value = fixed.get(v.kind, (None, None))
            clash = (flag if value is not None else None) \
                or (f"--plan's {v.target}" if v.kind == "plan" and v.target in plan_keys else None) \
                or (f"--arg {v.target}" if v.kind == "arg" and v.target in self.model_args else None) \
                or ("--seq-len" if v.kind == "arg" and v.target == "seq_len" and self.seq_len is not None else None) \
                or (f"--hw-set {v.target}" if v.kind == "cluster" and v.target in self.hw_overrides else None) \
                or ("--dtype" if v.kind == "plan" and v.target == "dtype" and self.dtype is not None else None)
            if clash:
                raise QuestionError(f"--vary {v.key} and {clash} both set it; drop one")
        if self.dtype is not None and "dtype" in plan_keys:
            raise QuestionError("--dtype and --plan's dtype both set it; drop one")
        # --vary hw / stack replaces --hw / --stack: a given one the sweep leaves out would be silently
        # ignored (one among the swept values loses nothing, as the README's examples give it)
        from smplan.hwprofiles import same_profile, same_stack

        given = {"hw": self.hw if self.hw_given else None, "stack": self.stack}
        same = {"hw": same_profile, "stack": same_stack}
        for v in self.varies:
            if given.get(v.kind) is not None and not any(same[v.kind](given[v.kind], value) for value in v.values):
                raise QuestionError(f"--{v.kind} {given[v.kind]} is not among --vary {v.key}'s values, which replace "
                                    f"it; add it to them or leave --{v.kind} out")

    def _check_stages_keep_their_chunks(self) -> None:
        """--plan's stages= lists pp*v model chunks: a sweep that changes the chunk count would
        make every point an error, so it is refused once, here."""
        from smplan.planner.plan import parse_inline

        if not self.plan or "stages" not in parse_inline(self.plan):
            return
        for v in self.varies:
            if v.kind == "plan" and v.target in ("pp", "virtual_stages", "schedule"):
                raise QuestionError(f"--vary {v.key} changes the pipeline's model chunks, which --plan's stages= "
                                    "lists one by one; drop stages= (an even split) or do not vary it")

    def _check_fp8_scaling_has_fp8(self) -> None:
        """--vary fp8_scaling only means something for fp8 points: without dtype=fp8 anywhere its
        "tensor" point would be a plain bf16 one and "block" infeasible."""
        from smplan.planner.plan import parse_inline

        if not any(v.kind == "plan" and v.target == "fp8_scaling" for v in self.varies):
            return
        fixed = (parse_inline(self.plan) if self.plan else {}).get("dtype", self.dtype)
        varied = [x for v in self.varies if v.kind == "plan" and v.target == "dtype" for x in v.values]
        if fixed != "fp8" and "fp8" not in varied:
            raise QuestionError("--vary fp8_scaling compares FP8 scalings: add --dtype fp8, dtype=fp8 to --plan, or "
                                "--vary dtype=fp8 (with bf16 too, to compare against it)")

    @property
    def timed(self) -> bool:
        return self.tokens is not None or self.days is not None

    def text(self) -> str:
        """The question in one sentence, for the top of the page."""
        name = self.model.rsplit(":", 1)[-1]
        varied = "; ".join(f"{v.key} in {{{', '.join(fmt_value(x) for x in v.values)}}}" for v in self.varies)
        if any(v.kind == "hw" for v in self.varies):  # a node of each profile holds its own GPU count
            where = (f"on {self.nodes} node{'s' if self.nodes != 1 else ''} of each hw profile (its own GPUs per node)"
                     if self.nodes else "on each hw profile")
        else:
            where = f"on {self.hw}" + (f" x {self.nodes} node{'s' if self.nodes != 1 else ''}" if self.nodes else "")
        how = f"with the plan {self.plan}" if self.plan else "re-planned at every point"
        if self.global_batch:  # (a --plan's own gbs is in the plan shown)
            how += f", global batch {self.global_batch}" + (
                " (one per GPU of the largest point; --global-batch sets another)" if self.global_batch_is_default else "")
        if self.dtype:
            how += f", in {self.dtype}"
        if self.tokens:
            goal = f"How long does training {name} on {self.tokens:.3g} {self.unit}s take, and what does it cost"
        elif self.days:
            goal = f"How many {self.unit}s does {name} train in {self.days:g} days, and at what cost"
        else:
            goal = f"How fast does {name} train"
        return f"{goal}, {where}, {how}, as {varied or 'nothing'} varies?"

    def to_dict(self) -> dict:
        return {
            "text": self.text(),
            "command": self.command,
            "model": self.model,
            "model_args": dict(self.model_args),
            "hw": self.hw,
            "nodes": self.nodes,
            "hw_overrides": dict(self.hw_overrides),
            "stack": self.stack,
            "vary": {v.key: list(v.values) for v in self.varies},
            "tokens": self.tokens,
            "days": self.days,
            "plan": self.plan,
            "global_batch": self.global_batch,
            "global_batch_is_default": self.global_batch_is_default,
            "dtype": self.dtype,
            "seq_len": self.seq_len,
            "checkpoint_interval_min": self.checkpoint_interval_min,
            "seeds": self.seeds,
            "unit": self.unit,
        }
