"""Starting the workers: torchrun's elastic agent locally, or an sbatch script for Slurm."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shlex
import sys
import uuid
from pathlib import Path

from .config import RunConfig
from .console import agent_console
from .failure import failure_line, failure_report, raised_line, root_failure, stderr_log
from .metrics import (
    ELASTIC_DIR,
    RUN_CONFIG_FILE,
    SBATCH_FILE,
    mark_stopped,
    read_metrics,
    repeats_stop,
)


class LaunchError(RuntimeError):
    """The workers failed (after the allowed restarts); the message says where the logs are.
    `exit_code` is what the command exits with: 1, or 128 + the signal that stopped the launcher
    (143 for SIGTERM), as a shell reports a process a signal ended. `run_dir` holds the run, and
    its stopped.json the one-line record of the stop."""

    def __init__(self, message: str, exit_code: int = 1, run_dir: Path | None = None):
        super().__init__(message)
        self.exit_code, self.run_dir = exit_code, run_dir


class LaunchInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run: the workers are gone, the run directory and checkpoints stay."""

    def __init__(self, run_dir: Path, how_to_continue: str = ""):
        super().__init__(f"interrupted; run directory kept at {run_dir}" + (f"; {how_to_continue}" if how_to_continue else ""))
        self.run_dir = run_dir


@contextlib.contextmanager
def _worker_env(extra: dict[str, str]):
    """Environment the elastic agent copies into each worker, restored afterwards."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _quiet_agent_on_interrupt():
    """Ctrl-C raises KeyboardInterrupt as usual, and from then on the log records of the
    agent's shutdown (each worker's exit, its "closing signal") are dropped: the user asked
    for the stop. Outside the main thread (no signal handlers there) nothing changes."""
    import logging
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    interrupted = []

    def on_sigint(signum, frame):
        # A second Ctrl-C (an impatient user; `timeout` passing the terminal's on to its group)
        # would land inside the agent's shutdown and skip stopping its log-tail thread, which
        # then keeps the interpreter from exiting: the shutdown already ends with SIGKILL after
        # shutdown_timeout_s, so the second is dropped. A third leaves at once, 130 as a shell's
        # Ctrl-C; the workers exit when they see the launcher gone (worker._exit_with_parent).
        interrupted.append(signum)
        if len(interrupted) == 2:
            print("stopping the workers; Ctrl-C once more to leave at once", file=sys.stderr, flush=True)
        if len(interrupted) >= 3:
            os._exit(130)
        if len(interrupted) > 1:
            return
        logging.disable(logging.CRITICAL)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.disable(logging.NOTSET)


@contextlib.contextmanager
def _agent_log_level(level: int):
    """The elastic agent's own records ("Sending process N closing signal SIGTERM", "failed
    (exitcode: -9) local_rank: 1 ...") at `level` while it runs: the launcher reports a failure in
    its own words (failure_report) and keeps every worker's log under RUN_DIR/elastic."""
    # torch's elastic modules set each of their loggers' own level (utils/logging.py
    # _setup_logger, WARNING), so the parent's level alone does not quiet "Received 15 death
    # signal, shutting down workers" (agent/server/api.py) on a SIGTERM
    names = ["torch.distributed.elastic", *(name for name in logging.root.manager.loggerDict
                                           if name.startswith("torch.distributed.elastic."))]
    loggers = [logging.getLogger(name) for name in names]
    previous = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, was in zip(loggers, previous, strict=True):
            logger.setLevel(was)


def _logs_specs(log_dir: Path, nproc_per_node: int):
    """Where the workers' output goes. Every worker's stderr lands in
    RUN_DIR/elastic/.../attempt_N/RANK/stderr.log, so a crash (an abort from C++ too) can be read
    after the run. The console shows local rank 0's stderr and stdout (the progress lines, the
    workers' own stdout, as a caller that redirects it expects), as torchtitan's run_train.sh does
    (torchrun --local-ranks-filter 0): a model bug raised on every rank would otherwise print one
    traceback per rank. The other ranks' stdout goes to their stdout.log; a failure on any rank
    is reported by the launcher with its last lines and its log's path (failure_report)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std

    return DefaultLogsSpecs(
        log_dir=str(log_dir), tee=Std.ERR, local_ranks_filter={0},
        # not redirected, a filtered rank's stdout would go to /dev/null (DefaultLogsSpecs.reify)
        redirects={rank: Std.OUT for rank in range(1, nproc_per_node)})


def launch_local(cfg: RunConfig, nproc_per_node: int, nnodes: int = 1, rdzv_endpoint: str | None = None,
                 max_restarts: int = 0, run_id: str | None = None, shutdown_timeout_s: int = 5,
                 earlier_stop: bytes | None = None) -> Path:
    """Run `cfg` under torch.distributed's elastic agent (what `torchrun` does).

    A failed worker makes the agent stop the others and restart the whole group (up to
    `max_restarts` times); workers resume from the newest complete checkpoint. `earlier_stop`:
    the folder's stopped.json from the attempt before this one (its launch cleared it).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from .worker import LAUNCHER_PID_ENV, run_forked

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / RUN_CONFIG_FILE
    cfg.save(config_path)
    launch = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc_per_node,
        # every node's agent must name the same run; one machine can take a fresh one
        run_id=run_id or (cfg.fingerprint if rdzv_endpoint else uuid.uuid4().hex),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",  # torchrun --standalone
        max_restarts=max_restarts,
        monitor_interval=0.1,
        logs_specs=_logs_specs(out / ELASTIC_DIR, nproc_per_node),
        shutdown_timeout=shutdown_timeout_s,
        # Ctrl-C stays a KeyboardInterrupt in this process (the agent): its shutdown then stops
        # the workers with SIGTERM, which ends them without a traceback each (forwarding SIGINT
        # would raise KeyboardInterrupt in every rank); SIGKILL follows after shutdown_timeout_s
        signals_to_handle="SIGTERM,SIGHUP,SIGQUIT",
        start_method="forkserver",
    )
    env = {
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
        LAUNCHER_PID_ENV: str(os.getpid()),  # ranks exit when this process is gone, killed too
        # torch 2.13's agent shares one TCPStore across restart rounds without a per-attempt
        # prefix, so a restarted rank can read the dead attempt's gloo addresses ("connection
        # refused"). Opting out makes each attempt's rank 0 host a fresh store.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),
    }
    try:
        with _worker_env(env), _quiet_agent_on_interrupt(), _agent_log_level(logging.CRITICAL), agent_console():
            with _fork_server():
                elastic_launch(launch, run_forked)(str(config_path))
    except KeyboardInterrupt:
        how = _how_to_continue(cfg)
        mark_stopped(out, "interrupted", f"stopped with Ctrl-C; {how}")
        raise LaunchInterrupted(out, how) from None
    except SignalException as err:  # SIGTERM / SIGHUP / SIGQUIT to this process: a closed terminal, a scheduler
        name, how = getattr(err.sigval, "name", str(err.sigval)), _how_to_continue(cfg)
        mark_stopped(out, "interrupted", f"stopped by {name}; {how}")
        raise LaunchError(f"stopped by {name}; run directory kept at {out}; {how}", 128 + int(err.sigval), out) from None
    except ChildFailedError as err:
        def log_of(failure):
            return stderr_log(out / ELASTIC_DIR, launch.run_id, failure.local_rank, failure.error_file)

        rank, first = root_failure(err.failures, log_of)
        log = log_of(first)
        # the console showed local rank 0's stderr as it ran (local_ranks_filter above), its traceback too
        what = failure_report(rank, first.exitcode, log, out / ELASTIC_DIR, shown_above=first.local_rank == 0)
        # whether it resumes, as an interrupted run's record says (README: stopped.json); after the last
        # step there is nothing to resume, which mark_stopped says itself
        cause = raised_line(log)
        repeated = repeats_stop(earlier_stop, out, cause)
        how = "" if _every_step_ran(cfg) else _how_to_continue(cfg, failed=True, repeated=repeated)  # mark_stopped says that one
        mark_stopped(out, "failed", failure_line(rank, first.exitcode, log) + (f"; {how}" if how else ""), cause)
        raise LaunchError(f"training failed after {max_restarts} restart(s): {what}" + (f"\n{how}" if how else ""),
                          run_dir=out) from None
    return out


# What every rank imports before its first step: torch, dynamo (torch.optim's step imports it) and
# the trainer; transformers too when the launcher's look at the model imported it (an hf: model).
# fork_server_exit makes the server leave without the interpreter's teardown of them.
FORK_SERVER_PRELOAD = ("torch", "torch._dynamo", "smplan.executor.worker", "smplan.executor.fork_server_exit")
# What every transformers model's module imports (PreTrainedModel; the layer base classes of recent
# versions): 1.1 s a rank of a tiny hf: Llama's start (python -X importtime). The fork server skips
# a name this version lacks (an ImportError).
TRANSFORMERS_PRELOAD = ("transformers", "transformers.modeling_utils", "transformers.modeling_layers")


@contextlib.contextmanager
def _fork_server():
    """Workers fork from one server that imported what they need once, instead of each rank
    importing it (a second launch of examples/gpt.py:tiny at dp=2, benchmarks/cli_startup.py:
    14.6 s of CPU with a process per rank, 9.4 s forked). Python's fork server is one per
    process: it starts inside the launch, so it holds the launch's environment and folder, and is
    stopped after it, so a later launch in this process starts its own. Forked from a server that
    never touched a GPU, a rank may use CUDA."""
    import multiprocessing
    from multiprocessing import forkserver

    extra = TRANSFORMERS_PRELOAD if "transformers" in sys.modules else ()
    multiprocessing.set_forkserver_preload([*FORK_SERVER_PRELOAD, *extra])
    try:
        yield
    finally:
        # no public call stops it; Python's own tests use this one (multiprocessing/forkserver.py)
        stop = getattr(forkserver._forkserver, "_stop", None)
        if stop:
            stop()


def _every_step_ran(cfg: RunConfig) -> bool:
    """Whether metrics.jsonl records the run's last step (a stop after it stopped nothing)."""
    ran = read_metrics(cfg.out_dir)
    return bool(ran) and ran[-1]["step"] >= cfg.steps


def _how_to_continue(cfg: RunConfig, failed: bool = False, repeated: bool = False) -> str:
    """What a stopped run's record tells the user: a resume needs a checkpoint to continue from.
    `failed`: a rank raised (not an interruption), which before the first step repeats on a rerun;
    `repeated`: it raised as the attempt before it did, at the same step, so a resume would too."""
    from .checkpoint import latest

    found = latest(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if _every_step_ran(cfg):  # stopped in the shutdown: a resume would find no step to run
        return "every step ran and was recorded, so there is nothing left to resume"
    if not found and not read_metrics(cfg.out_dir):  # nothing ran: the folder takes the same command again
        if failed:  # a model, data or plan error: a rerun meets it again
            return ("it failed before its first step, where a rerun is likely to fail the same way: fix what the "
                    "error says, then the same `smplan execute` command starts it again")
        return "it stopped before its first step: the same `smplan execute` command starts it again"
    if found and repeated:  # the same checkpoint, data and code meet the same error again
        return (f"it failed with the same error after the same step as the attempt before it, so a resume is "
                f"likely to fail the same way: fix what the error says (the data, the model or the plan) first; "
                f"then the same `smplan execute` command with -o {cfg.out_dir} resumes it from its newest "
                f"checkpoint ({Path(found[1]).name})")
    if found:  # -o named: a run without it was given a new folder (run.py), so the same command would start afresh
        return (f"the same `smplan execute` command with -o {cfg.out_dir} resumes it from its newest checkpoint "
                f"({Path(found[1]).name})")
    if cfg.checkpoint_every:  # it was asked for checkpoints: advising --checkpoint-every would repeat it
        first = min(cfg.checkpoint_every, cfg.steps)  # the end of the run writes one too (train.py)
        return (f"it stopped before its first checkpoint (step {first}), so it cannot be resumed: run it again with "
                "another -o/--output (or delete this folder)")
    return ("it wrote no checkpoint, so it cannot be resumed: run it again with another -o/--output (or delete "
            "this folder); --checkpoint-every N makes a run resumable")


# Slurm's --time for a job the plan predicts nothing for (an inline plan): one hour, the fixed
# value the script had before it was priced; --time-limit sets another.
DEFAULT_SLURM_TIME = "01:00:00"
# Start-up of one attempt inside the allocation: process launch, rendezvous, model build, a
# checkpoint's load. Assumed, not measured: 10 minutes, under the hardware profiles'
# restart_minutes (15), which also count detecting the failure and rescheduling. Every restart pays it.
SLURM_STARTUP_S = 600.0
# Room on the predicted steps: the cost model's worst per-source MAPE on published runs is 18%
# (benchmarks/validate_published.py, Megatron-Bridge), and the first steps warm up and compile.
SLURM_STEP_MARGIN = 1.5
# The forms of sbatch --time (sbatch(1), "-t, --time"): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_SLURM_TIME = re.compile(r"(\d+)(:\d+){0,2}|\d+-\d+(:\d+){0,2}")


class SlurmTimeError(ValueError):
    """A --time-limit sbatch would not take: the user's, shown in one line."""


def check_slurm_time(text: str) -> str:
    """`text` if sbatch takes it as --time, else a SlurmTimeError saying the forms it takes."""
    if not _SLURM_TIME.fullmatch(text.strip()) or not any(ch != "0" for ch in text if ch.isdigit()):
        raise SlurmTimeError(f"--time-limit must be a Slurm time such as 90 (minutes), 4:00:00 or 2-00:00:00 "
                         f"(days-hours:minutes:seconds), above zero; got {text!r}")
    return text.strip()


def slurm_time_limit(predicted_step_s: float | None, steps: int, max_restarts: int = 0) -> tuple[str, str]:
    """(sbatch --time, why) for `steps` (those left to run) of a plan predicted at
    `predicted_step_s` (None or 0: unknown, DEFAULT_SLURM_TIME).

    Every attempt (the first and each restart) pays the start-up; the steps get
    SLURM_STEP_MARGIN (checkpoint writes and evaluations are not priced: the margin covers a
    few). Rounded up to whole minutes, as D-HH:MM:SS past a day.
    """
    if not predicted_step_s or predicted_step_s <= 0:
        return DEFAULT_SLURM_TIME, "the plan predicts no step time (an inline plan, or a file without predicted figures), so 1 hour"
    seconds = (1 + max_restarts) * SLURM_STARTUP_S + SLURM_STEP_MARGIN * predicted_step_s * steps
    minutes = math.ceil(seconds / 60.0)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    limit = f"{days}-{hours:02d}:{minutes:02d}:00" if days else f"{hours:02d}:{minutes:02d}:00"
    attempts = f" for each of {1 + max_restarts} attempts" if max_restarts else ""
    why = (f"{SLURM_STEP_MARGIN:g}x the predicted {predicted_step_s:.3g} s/step x {steps} steps, plus "
           f"{SLURM_STARTUP_S / 60:.0f} minutes of start-up{attempts}")
    return limit, why


# The c10d rendezvous port: SLURM_RDZV_PORT_BASE + $SLURM_JOB_ID mod SLURM_RDZV_PORT_SPAN, so two
# jobs that share a node (a fixed 29500 made the second one's store fail to bind) take different
# ports unless their job IDs are a multiple of the span apart. 20000-29999 is above the privileged
# ports (< 1024) and below Linux's default ephemeral range (32768-60999, net.ipv4.ip_local_port_range),
# where an outgoing connection could already hold the port.
SLURM_RDZV_PORT_BASE = 20000
SLURM_RDZV_PORT_SPAN = 10000
# Characters a path in the script cannot carry: sbatch reads an #SBATCH value's quotes and backslashes
# itself (src/sbatch/opt.c, _get_argument), and a backslash in --output turns off its %j
# (sbatch(1), "filename pattern"); a newline ends the directive.
_SBATCH_UNSAFE = ('"', "\\", "\n")


def sbatch_path_problem(run_dir: str | Path) -> str | None:
    """Why `run_dir` cannot hold a Slurm job's files, in one line, or None when it can."""
    bad = [ch for ch in _SBATCH_UNSAFE if ch in str(run_dir)]
    if not bad:
        return None
    return (f"the run directory {str(run_dir)!r} holds {' and '.join(map(repr, bad))}, which sbatch's #SBATCH "
            "--output line cannot carry; pass an -o/--output without quotes, backslashes or newlines")


def _sbatch_log(run_dir: Path, job_name: str) -> str:
    """The #SBATCH --output value for the job's log in `run_dir`: double-quoted, as sbatch groups a
    quoted value with its spaces (src/sbatch/opt.c, _get_argument); a literal % in the folder
    doubled, as its filename pattern reads "%%" as one and "%j" as the job ID (sbatch(1), "filename pattern")."""
    return '"' + str(run_dir).replace("%", "%%") + f'/{job_name}-%j.out"'


def sbatch_script(cfg_path: str | Path, nnodes: int, nproc_per_node: int, gpus_per_node: int,
                  job_name: str = "smplan", max_restarts: int = 0,
                  time_limit: str = DEFAULT_SLURM_TIME) -> str:
    """An sbatch script: one srun task per node, each a torchrun agent joining a c10d
    rendezvous hosted on the first node of the allocation."""
    cfg = shlex.quote(str(cfg_path))
    log = _sbatch_log(Path(cfg_path).parent, job_name)
    gres = f"#SBATCH --gpus-per-node={gpus_per_node}\n" if gpus_per_node else ""
    # as launch_local's _logs_specs: local rank 0 on the job's log, every rank's stderr and the
    # other ranks' stdout under RUN_DIR/elastic (torchrun --redirects takes local_rank:1 for stdout)
    redirects = (" --redirects=" + ",".join(f"{r}:1" for r in range(1, nproc_per_node))) if nproc_per_node > 1 else ""
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nnodes}
#SBATCH --ntasks={nnodes}
#SBATCH --ntasks-per-node=1
{gres}#SBATCH --cpus-per-task={max(1, 4 * nproc_per_node)}
#SBATCH --time={time_limit}
#SBATCH --output={log}
set -euo pipefail

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# a port of the job's own, 20000-29999: two jobs sharing a node would collide on a fixed one
rdzv_port=$(({SLURM_RDZV_PORT_BASE} + SLURM_JOB_ID % {SLURM_RDZV_PORT_SPAN}))
export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}}
# a fresh rendezvous store per restart round (see launch_local)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# Slurm 22.05 to 23.02's srun does not inherit --cpus-per-task from sbatch; the documented way
# to pass it on (sbatch(1), --cpus-per-task; Slurm 22.05 release notes)
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK

srun --nodes={nnodes} --ntasks={nnodes} --ntasks-per-node=1 \\
  {shlex.quote(sys.executable)} -m torch.distributed.run \\
    --nnodes={nnodes} \\
    --nproc-per-node={nproc_per_node} \\
    --max-restarts={max_restarts} \\
    --rdzv-backend=c10d \\
    --rdzv-endpoint="$head_node:$rdzv_port" \\
    --rdzv-id="$SLURM_JOB_ID" \\
    --log-dir={shlex.quote(str(Path(cfg_path).parent / ELASTIC_DIR))} --tee=2 --local-ranks-filter=0{redirects} \\
    -m smplan.executor.worker {cfg}
"""


def write_sbatch(cfg: RunConfig, nnodes: int, nproc_per_node: int, gpus_per_node: int,
                 max_restarts: int = 0, time_limit: str = DEFAULT_SLURM_TIME) -> Path:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_path = (out / RUN_CONFIG_FILE).resolve()
    cfg.save(config_path)
    script = out / SBATCH_FILE
    script.write_text(sbatch_script(config_path, nnodes, nproc_per_node, gpus_per_node,
                                    max_restarts=max_restarts, time_limit=time_limit))
    script.chmod(0o755)
    return script
