"""The training loop one worker runs: data, forward/backward (or the pipeline schedule),
gradient clipping over the full parameters, AdamW, metrics and checkpoints."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from smplan.planner.model_file import load_model_file
from torch.utils._pytree import tree_map

from smplan.model import call_model, default_loss, tokens_per_sample

from . import checkpoint, grad_compress, recipe, token_data
from .build import build_model_parts
from .config import FAIL_ENV, FAIL_RANK_ENV, RunConfig, parse_slow_rank
from .context_parallel import SequenceShard, sequence_length, weighted_loss
from .data import BatchSource
from .expert_parallel import reduce_expert_grads
from .float8 import fp8_line
from .grad_norms import block_grad_norms, by_layout, squared_norm
from .mesh import ParallelDims
from .metrics import (
    ELASTIC_DIR,
    LAYOUT,
    NON_FINITE_FILE,
    TENSORBOARD_DIR,
    WARM_UP,
    MetricsWriter,
    layout_tag,
    peak_memory_gib,
    peak_memory_source,
    progress,
    rank_file,
    rate_key,
    summarize,
)
from .precision import autocast_dtype
from .timing import PhaseTimer


def clip_grad_norm_(params, max_norm: float, pp_group=None) -> torch.Tensor:
    """Global 2-norm over the full parameters, then clip (torchtitan's recipe); max_norm 0: only the norm.

    DTensor gradients (TP / FSDP shards) are grouped by mesh and placement, normed per
    group and reduced to full values; pipeline stages add their squares over pp.
    """
    grads = [p.grad for p in params if p.grad is not None]
    groups = by_layout(grads)
    total_sq = squared_norm(groups, grads[0].device if grads else torch.device("cpu"))
    if pp_group is not None:
        dist.all_reduce(total_sq, group=pp_group)
    total = total_sq.sqrt()
    if max_norm <= 0:
        return total
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for group in groups.values():
        torch._foreach_mul_(group, coef.to(group[0].dtype))
    return total


def _device_and_backend() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def dtype_name(dtype: torch.dtype) -> str:
    """A plan's name for a torch dtype: bf16, fp16, else fp32."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.plan = cfg.plan_obj()
        self.model_file = load_model_file(cfg.model_ref)
        self.device, backend = _device_and_backend()
        dist.init_process_group(backend, timeout=timedelta(seconds=cfg.collective_timeout_s))
        self.rank = dist.get_rank()
        self.dims = ParallelDims(self.plan.pp, self.plan.dp, self.plan.tp, dist.get_world_size(),
                                 gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), cp=self.plan.cp,
                                 ep=self.plan.ep)
        self.dims.build_mesh(self.device.type)
        self.loss_fn = plain_loss(self.model_file.hook("loss") or default_loss)
        # Context parallelism: this rank's share of every sequence; its loss is weighted so
        # that the mean over the cp ranks is the whole sequence's mean.
        self.sequence = self._sequence_shard() if self.dims.cp_enabled else None
        if self.sequence is not None:
            self.loss_fn = weighted_loss(self.loss_fn, self.sequence)
        # fp8: the float8 linears' casts and GEMMs inside bf16 autocast for the rest, as torchtitan
        amp = autocast_dtype(self.plan.dtype, self.device.type)
        self.autocast = (lambda: torch.autocast("cuda", dtype=amp)) if amp else contextlib.nullcontext
        self.parts = build_model_parts(self.plan, self.model_file, self.dims, self.device, cfg.seed, self.loss_fn,
                                       sequence=self.sequence)
        # without autocast the parameters' own dtype computes: fp32 from a model file, an hf:
        # config's torch_dtype (bf16) as built
        built = next((p.dtype for p in self.parts.parameters() if p.is_floating_point()), torch.float32)
        self.compute_dtype = dtype_name(amp or built)
        if self.parts.fp8_linears and self.parts.fp8_linears[0]:  # float8 GEMMs on CPU too (torch._scaled_mm)
            self.compute_dtype = "fp8"
        # A vocab-parallel head hands the loss sharded logits (a DTensor): cross-entropy
        # and its backward then reduce over the tp ranks instead of gathering the vocabulary.
        self.loss_context = _loss_parallel if self.parts.loss_parallel else contextlib.nullcontext
        self.recipe = cfg.recipe()
        self.optimizers, self.decayed = [], []
        for chunk in self.parts.chunks:  # two groups: no weight decay on norms, biases, 1-D tensors
            groups, decayed = recipe.param_groups(chunk, cfg.weight_decay)
            self.optimizers.append(torch.optim.AdamW(groups, lr=cfg.lr, betas=self.recipe.betas))
            self.decayed.append(decayed)
        self.data, self.val_data = self._data_sources()
        self.tokens_per_sample = None
        self.layout = self.parts.layout
        self.slow = parse_slow_rank(cfg.slow_rank)

    def _sequence_shard(self) -> SequenceShard:
        seq_len = self.cfg.data_seq_len if self.cfg.data else sequence_length(self.plan, self.model_file)
        return SequenceShard(seq_len, self.plan.cp, self.dims.coord("cp"), self.dims["cp"].get_group(), self.device)

    def _local(self, t):
        """This rank's tokens of a micro-batch tensor (all of it without cp), on the device; a
        dict or tuple of inputs (pp=1, cp=1: executor.validate) moves to the device whole."""
        if not isinstance(t, torch.Tensor):
            return tree_map(lambda x: x.to(self.device) if isinstance(x, torch.Tensor) else x, t)
        t = t.to(self.device)
        return self.sequence.split(t) if self.sequence is not None else t

    def _data_sources(self):
        """The model file's batches, or --data's token stream (and --val-data's)."""
        plan, cfg = self.plan, self.cfg
        if not cfg.data:
            return BatchSource(self.model_file, self.parts.reference, plan.micro_batch,
                               plan.num_microbatches, self.dims.coord("dp"), plan.dp, cfg.seed), None

        def source(path, label):
            seqs = token_data.Sequences(token_data.TokenStream(path, cfg.data_dtype, label), cfg.data_seq_len)
            return token_data.TokenBatchSource(seqs, plan.micro_batch, plan.num_microbatches,
                                               self.dims.coord("dp"), plan.global_batch, cfg.vocab)

        return source(cfg.data, "--data"), (source(cfg.val_data, "--val-data") if cfg.val_data else None)

    # -- one step ---------------------------------------------------------------------------
    def _forward_backward(self, step: int, timer: PhaseTimer) -> torch.Tensor:
        """This rank's mean loss over its micro-batches (zero off the last pipeline stage).

        Phases: `forward` and `backward` (DDP/FSDP communication that overlaps them is
        inside); under pipelining one `forward_backward`, as the schedule interleaves them.
        """
        micro = self.data.microbatches(step)
        if self.tokens_per_sample is None:
            self.tokens_per_sample = tokens_per_sample(micro[0][0])
        if self.parts.schedule is not None:
            loss = self._pipeline_step(micro)
            timer.mark("forward_backward")
            return loss
        model, n = self.parts.chunks[0], len(micro)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(micro):
            with _grad_sync(model, i == n - 1, self.plan.zero), self.loss_context():
                with self.autocast():
                    loss = self.loss_fn(call_model(model, self._local(x)), self._local(y))
                timer.mark("forward")
                (loss / n).backward()
                timer.mark("backward")
            total += loss.detach().float()
        return total / n

    def _pipeline_step(self, micro, forward_only: bool = False) -> torch.Tensor:
        first, last = self.dims.is_first_stage, self.dims.is_last_stage
        args = (self._local(torch.cat([x for x, _ in micro])),) if first else ()
        kwargs = {}
        losses: list[torch.Tensor] = []
        if last:
            kwargs = {"target": self._local(torch.cat([y for _, y in micro])), "losses": losses}
        with self.autocast(), self.loss_context():
            (self.parts.schedule.eval if forward_only else self.parts.schedule.step)(*args, **kwargs)
        if last:
            return torch.stack([loss.detach().float() for loss in losses]).mean()
        return torch.zeros((), device=self.device)

    def train_step(self, step: int) -> dict:
        """One optimizer step: loss, grad_norm, phases_s, sync_wait_s, maybe block_grad_norms."""
        timer = PhaseTimer(self.device)
        local = self._forward_backward(step, timer)
        if self.parts.expert_banks:  # ep > 1: the data-parallel wrappers left the experts to us
            reduce_expert_grads(self.parts.expert_banks, self.dims["edp"], self.plan.dp * self.plan.cp)
            timer.mark("expert_grad_reduce")
        pp_group = self.dims["pp"].get_group() if self.dims.pp_enabled else None
        out = {}
        every = self.cfg.grad_norms_every
        if every and (step % every == 0 or step == 1):
            out["block_grad_norms"] = block_grad_norms(self.parts.chunks, self.layout, self.device, pp_group)
            timer.mark("block_grad_norms")
        params = list(self.parts.parameters())
        norm = clip_grad_norm_(params, self.recipe.grad_clip, pp_group)
        self._stop_if_not_finite(step, local, norm)
        timer.mark("grad_clip")
        for opt, decayed in zip(self.optimizers, self.decayed, strict=True):
            out["lr"] = recipe.apply(opt, step, self.recipe, decayed)
            opt.step()
            opt.zero_grad(set_to_none=True)
        timer.mark("optimizer")
        self._maybe_slow(timer)
        # The step-end all-reduce (_replica_mean) is where every rank waits for the slowest one: its time
        # on this rank is how long the others kept it waiting (what straggler detection
        # reads; a rank slow before the optimizer step is waited for at the NaN check's
        # all-reduce already, inside the grad_clip phase). On CUDA the queued work is finished first so the wait is not mistaken
        # for this rank's own compute.
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        loss = self._replica_mean(local)
        out["sync_wait_s"] = time.perf_counter() - t0
        out.update(loss=loss, grad_norm=norm.item(), phases_s=timer.totals_s())
        return out

    def _stop_if_not_finite(self, step: int, local: torch.Tensor, norm: torch.Tensor) -> None:
        """Raise NonFiniteLossError, on every rank at once, when this step's loss on any rank or the
        global gradient norm is NaN or infinite: before the optimizer applies it, so neither the
        weights nor a checkpoint take the step. Megatron-LM does the same by default
        (--check-for-nan-in-loss-and-grad). One MAX all-reduce of the two flags: a rank's loss
        alone may be the bad one, and every rank must stop at the same collective."""
        flags = torch.stack([~torch.isfinite(local), ~torch.isfinite(norm.to(local.device))]).float()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        loss_bad, norm_bad = (bool(f) for f in flags.tolist())
        if loss_bad or norm_bad:
            found = checkpoint.latest(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir else None
            line = non_finite_line(step, loss_bad, norm.item(), self.recipe, found[0] if found else None)
            if self.rank == 0:  # for this launch's restarts (_refuse_repeat_of_non_finite)
                with open(os.path.join(self.cfg.out_dir, NON_FINITE_FILE), "w") as f:
                    f.write(line + "\n")
            raise NonFiniteLossError(line)

    def _refuse_repeat_of_non_finite(self, restart: int) -> None:
        """Stop a restart of a group that stopped on a NaN or infinite loss: it would resume the same
        checkpoint with the same data and lr and stop at the same step again, once per --max-restarts
        (Megatron-LM exits on a NaN rather than retrying). The first attempt of a launch removes an
        earlier launch's record on every node; on a restart every rank reads its node's copy and
        all gather them, so all decide alike where the run folder is not shared between nodes and
        the restart put rank 0 on another node."""
        path = os.path.join(self.cfg.out_dir, NON_FINITE_FILE)
        if restart == 0:
            with contextlib.suppress(FileNotFoundError):  # another rank on this node may be first
                os.remove(path)
            return
        mine = None
        with contextlib.suppress(FileNotFoundError):
            with open(path) as f:
                mine = f.read().strip() or None
        found = [None] * dist.get_world_size()
        dist.all_gather_object(found, mine)
        found = [next((line for line in found if line), None)]
        if found[0]:
            raise NonFiniteLossError(f"restart {restart} not run (it would resume the same weights and data and stop "
                                     f"at the same step): {found[0]}")

    def _replica_mean(self, local: torch.Tensor) -> float:
        """The mean over dp replicas of a per-replica loss, each counted once: from its last
        pipeline stage, first tp rank (every cp rank holds a weighted share of it)."""
        owner = self.dims.is_last_stage and self.dims.coord("tp") == 0
        report = local if owner else torch.zeros_like(local)
        dist.all_reduce(report)
        return report.item() / (self.plan.dp * self.plan.cp)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the first --eval-batches global batches of --val-data (forward only)."""
        for chunk in self.parts.chunks:
            chunk.eval()
        total = torch.zeros((), device=self.device)
        try:
            for k in range(1, self.cfg.eval_batches + 1):
                micro = self.val_data.microbatches(k)
                if self.parts.schedule is not None:
                    total += self._pipeline_step(micro, forward_only=True)
                    continue
                model = self.parts.chunks[0]
                for x, y in micro:
                    with self.loss_context(), self.autocast():
                        total += self.loss_fn(call_model(model, self._local(x)), self._local(y)).float() / len(micro)
        finally:
            for chunk in self.parts.chunks:
                chunk.train()
        return self._replica_mean(total / self.cfg.eval_batches)

    # -- the run ----------------------------------------------------------------------------
    def _maybe_fail(self, step: int) -> None:
        fail_at = self.cfg.fail_at_step or int(os.environ.get(FAIL_ENV, 0) or 0)
        if not fail_at or step != fail_at or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        victim = self.cfg.fail_rank
        if victim is None:
            victim = int(os.environ.get(FAIL_RANK_ENV, dist.get_world_size() - 1))
        if self.rank == victim:
            print(f"[smplan] test hook: SIGKILL rank {self.rank} at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def _maybe_slow(self, timer: PhaseTimer) -> None:
        """Test hook (SMPLAN_SLOW_RANK=RANK:SECONDS): a straggler. It sleeps just before the
        step-end synchronisation, so the delay is its own time and the others wait for it."""
        if self.slow and self.rank == self.slow[0]:
            if self.device.type == "cuda":  # else queued GPU work would run during the sleep
                torch.cuda.synchronize(self.device)
            time.sleep(self.slow[1])
            timer.mark("injected_delay")

    def _resume(self) -> int:
        if not self.cfg.checkpoint_dir:
            return 0

        def load(path):
            checkpoint.load_train_state(self.parts.chunks, self.optimizers, path)
            return checkpoint.load_rank_state(path, self.rank)

        found = checkpoint.load_newest_readable(self.cfg.checkpoint_dir, self.cfg.fingerprint,
                                                self.cfg.force_resume, load, self._gather, self._say,
                                                inputs=self.cfg.fingerprint_inputs)
        if found is None:
            return 0
        step, path, own = found
        self.data.skip(step)
        self._resume_powersgd(own, path)
        if own is not None:  # after skip: a data stream may draw from the generators too
            checkpoint.set_rng_state(own["rng"], self.device)
        else:
            self._say(f"{path} holds no per-rank RNG state; dropout will not repeat bit for bit")
        self._say(f"resumed from {path} (step {step})")
        return step

    def _gather(self, item) -> list:
        """Every rank's `item`, in rank order (a collective)."""
        items = [None] * dist.get_world_size()
        dist.all_gather_object(items, item)
        return items

    def _say(self, line: str) -> None:
        """One progress line from rank 0 (the others would repeat it)."""
        if self.rank == 0:
            print(f"[smplan] {line}", flush=True)

    def _init_from(self) -> None:
        from .init_from import load_weights, open_source

        load_weights(self.parts.chunks, open_source(self.cfg.init_from))
        if self.rank == 0:
            print(f"[smplan] initial weights from {self.cfg.init_from}", flush=True)

    def _resume_powersgd(self, own: dict | None, path) -> None:
        """PowerSGD's error feedback, warm-start matrices and step counter, as saved; a
        checkpoint without them (written uncompressed) starts the compression afresh."""
        if self.parts.powersgd is None:
            return
        saved = (own or {}).get("powersgd")
        if saved is not None:
            self.parts.powersgd.load_state_dict(saved)
        elif self.rank == 0:
            print(f"[smplan] {path} holds no PowerSGD state; the compression restarts (plain all-reduce for "
                  f"{grad_compress.POWERSGD_START_STEP} steps, no error feedback carried over)", flush=True)

    def _powersgd_state(self) -> dict | None:
        return self.parts.powersgd.state_dict() if self.parts.powersgd is not None else None

    def _save(self, step: int) -> None:
        # The lr schedule and the data position are functions of the step: recorded, not needed to resume.
        meta = {"fingerprint": self.cfg.fingerprint, checkpoint.FINGERPRINT_INPUTS: self.cfg.fingerprint_inputs,
                "plan": self.cfg.plan, "model": self.cfg.model_ref, "recipe": self.recipe.to_dict(),
                "seed": self.cfg.seed, checkpoint.RUN_DIR: self.cfg.out_dir}
        if self.cfg.data:
            meta["data"] = self.data.position(step)
        checkpoint.save(self.cfg.checkpoint_dir, step, self.parts.chunks, self.optimizers, meta,
                        self.rank, dist.barrier, rank_state={"rng": checkpoint.rng_state(self.device),
                                                             "powersgd": self._powersgd_state()})
        if self.rank == 0 and self.cfg.keep_checkpoints:  # after the new one is complete: never fewer than K
            checkpoint.prune(self.cfg.checkpoint_dir, self.cfg.keep_checkpoints, step, self.cfg.fingerprint)

    def _tensorboard(self, start: int):
        from .tensorboard_log import TensorBoardLog

        predicted = self.plan.predicted.step_time_s if self.plan.predicted else None
        return TensorBoardLog(os.path.join(self.cfg.out_dir, TENSORBOARD_DIR), predicted, resume_step=start)

    def run(self) -> None:
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)  # set by the elastic agent
        if restart:  # the agent's own records are quiet (launch.py): say that the group restarted, and where to look
            self._say(f"restart {restart} of {os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}: the previous attempt "
                      f"failed; every rank's log of it is under {os.path.join(self.cfg.out_dir, ELASTIC_DIR)}/*/"
                      f"attempt_{restart - 1}/")
        self._refuse_repeat_of_non_finite(restart)
        if self.parts.fp8_linears is not None:
            converted, linears, banks = self.parts.fp8_linears
            self._say(fp8_line(converted, linears, self.plan.fp8_scaling, banks))
        start = self._resume()
        if start == 0 and self.cfg.init_from:  # a resumed run continues from its own checkpoint
            self._init_from()
        writer = MetricsWriter(self.cfg.out_dir, resume_step=start) if self.rank == 0 else None
        rank_writer = MetricsWriter(self.cfg.out_dir, start, path=rank_file(self.cfg.out_dir, self.rank))
        board = self._tensorboard(start) if self.cfg.tensorboard and self.rank == 0 else None
        every, steps = self.cfg.checkpoint_every, self.cfg.steps
        tokens_per_step = None
        layout = layout_tag(self.plan.to_dict(), self.compute_dtype)  # a resume under another plan keeps earlier steps
        try:
            for step in range(start + 1, steps + 1):
                self._maybe_fail(step)
                t0 = time.perf_counter()
                result = self.train_step(step)
                dt = time.perf_counter() - t0
                own_mem = peak_memory_gib(self.device)
                mem = torch.tensor([own_mem], device=self.device)  # NCCL reduces only device tensors
                dist.all_reduce(mem, op=dist.ReduceOp.MAX)
                if tokens_per_step is None:
                    tokens_per_step = self.plan.global_batch * (self.plan.seq_len or self.tokens_per_sample)
                tags = {LAYOUT: layout, **({WARM_UP: True} if step == start + 1 else {})}  # first since the workers started
                rank_writer.write({
                    "step": step, "rank": self.rank, "step_time_s": dt, "sync_wait_s": result["sync_wait_s"],
                    "phases_s": result["phases_s"], "tokens_per_s": tokens_per_step / dt,
                    "peak_memory_gib": own_mem, "peak_memory_source": peak_memory_source(self.device),
                    "loss": result["loss"], "grad_norm": result["grad_norm"], "lr": result["lr"], **tags})
                val_every = self.cfg.eval_every
                val_loss = self.evaluate() if val_every and (step % val_every == 0 or step == steps) else None
                if writer is not None:
                    record = {"step": step, "loss": result["loss"], "step_time_s": dt,
                              "tokens_per_s": tokens_per_step / dt, "samples_per_s": self.plan.global_batch / dt,
                              "peak_memory_gib": mem.item(), "grad_norm": result["grad_norm"],
                              "lr": result["lr"], "phases_s": result["phases_s"], **tags}  # rank 0's; all in ranks/
                    if val_loss is not None:
                        record["val_loss"] = val_loss
                    if "block_grad_norms" in result:
                        record["block_grad_norms"] = result["block_grad_norms"]
                    writer.write(record)
                    if board is not None:
                        board.write(record)
                    progress(record, steps, rate_key(self.plan.seq_len, self.tokens_per_sample))
                if self.cfg.checkpoint_dir and every and (step % every == 0 or step == steps):
                    self._save(step)
        finally:
            if board is not None:
                board.close()
        if self.rank == 0:
            predicted = self.plan.predicted.to_dict() if self.plan.predicted else None
            summarize(self.cfg.out_dir, predicted, self.plan.to_dict(), self.device.type, self.compute_dtype,
                      rate_key(self.plan.seq_len, self.tokens_per_sample))
        # Tear gloo down together: a rank that destroys its groups while a peer is still
        # busy (rank 0 writing the summary) can abort ("terminate called without an active
        # exception", 1 run in ~8 with tp=2 on CPU). Only after success: a failed run must not hang.
        dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class NonFiniteLossError(RuntimeError):
    """A step's loss or gradient norm is NaN or infinite; the run stops before that step's update."""


def non_finite_line(step: int, loss_bad: bool, grad_norm: float, rec: recipe.Recipe,
                    checkpoint_step: int | None = None) -> str:
    """One line: the step, what was not finite, what to change (the lr, warmup, clipping, the
    data), and the newest checkpoint, which the stop leaves as it was."""
    what = (f"the loss is NaN or infinite (gradient norm {grad_norm:g})" if loss_bad
            else f"the gradient norm is {grad_norm:g}")
    fixes = [f"a lower --lr (this run's peak lr is {rec.lr:g})"]
    if not rec.warmup_steps:
        fixes.append("--warmup-steps N")
    if rec.grad_clip <= 0:
        fixes.append("--grad-clip 1.0")
    kept = (f"; the checkpoint of step {checkpoint_step} is kept (resuming it with another --lr, "
            "--warmup-steps or --grad-clip needs --force-resume)") if checkpoint_step else ""
    return (f"step {step}: {what}, so the run stopped before applying that step; try {', '.join(fixes)}, or "
            f"check the data and the model's forward for values that overflow{kept}")


def plain_loss(loss_fn):
    """`loss_fn` returning a plain tensor: under loss_parallel the loss is a replicated
    DTensor, whose local value is the loss (its backward still runs through DTensor)."""
    def fn(outputs, targets):
        loss = loss_fn(outputs, targets)
        # no DTensor exists unless its module was imported (1.5 s, which a DDP run need not pay)
        dtensor = sys.modules.get("torch.distributed.tensor")
        return loss.to_local() if dtensor is not None and isinstance(loss, dtensor.DTensor) else loss

    return fn


def _loss_parallel():
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


@contextlib.contextmanager
def _grad_sync(model, sync: bool, zero: int = 0):
    """Gradient reduction across micro-batches as the plan's ZeRO stage prices and sizes it.

    DDP, and FSDP2 under ZeRO-1: reduce only on the last micro-batch (no_sync), the full
    gradients accumulating meanwhile (ZeRO-1 keeps them whole). ZeRO-2/3: reduce-scatter on
    every micro-batch, so only the shard stays (the memory model's gradients / dp, and the cost
    model's reduce-scatter per micro-batch, as DeepSpeed ZeRO-2/3 reduce each micro-batch's
    gradients into their partitions). ZeRO-1/2 (parameters not resharded after forward) also
    keep the gathered parameters until the last micro-batch's backward, so a step gathers each
    block once, not once per micro-batch (FSDP2 `set_reshard_after_backward`: "during gradient
    accumulation"); ZeRO-3 reshards after every backward."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel) and not sync:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync or zero >= 2)
        if zero in (1, 2):
            model.set_reshard_after_backward(sync)
    yield
