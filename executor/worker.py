"""Entry point of one training process under torchrun: `python -m smplan.executor.worker CONFIG`."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from .checkpoint import ONE_LINE_ERRORS
from .config import RunConfig
from .console import WORKER_ERROR, Console
from .failure import LOST_PEER_LINE
from .token_data import TokenDataError
from .train import NonFiniteLossError, Trainer

# The launcher's pid (launch.launch_local sets it): a rank forked from the launcher's fork server
# has that server as its parent, which outlives a killed launcher (every rank holds the server's
# "alive" pipe: multiprocessing.forkserver), so the parent test alone never fires there.
LAUNCHER_PID_ENV = "SMPLAN_LAUNCHER_PID"


def _gone(pid: int) -> bool:
    """Whether process `pid` has exited: absent, or a zombie its parent has not reaped yet
    (/proc on Linux; elsewhere only absence is seen)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[-1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """torchrun starts workers in their own sessions; if the agent dies (killed test, lost
    node, `kill -9` of the launcher) nothing would stop them, so a worker whose parent or
    launcher is gone exits."""
    parent = os.getppid()
    launcher = int(os.environ.get(LAUNCHER_PID_ENV) or 0)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent or (launcher and _gone(launcher)):
                os._exit(70)

    threading.Thread(target=watch, name="smplan-parent-watch", daemon=True).start()


def leave_at_once(code: int = 0) -> None:
    """Flush and leave without the interpreter's teardown: destroying gloo's group or that teardown
    can std::terminate on a C++ thread ("terminate called without an active exception", rank 0
    after the last step, ~1 run in 10 with tp=2 on 2 CPU cores). Callers first meet every rank
    at a barrier, so nothing is left to write."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# How gloo and NCCL report a peer that is gone (torch 2.x: gloo's tcp pair.cc, ProcessGroupNCCL).
LOST_PEER = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "NCCL communicator was aborted",
             "remote process exited or there was a network error")
# gloo's transport errors name their source file; NCCL's arrive as torch.distributed's DistError types
GLOO_TRANSPORT = "gloo/transport"


# Seconds a rank that lost its peer waits before exiting. The agent polls its workers every
# 0.1 s (launch.py) and stops the rest once it sees the failed one; a failing rank's traceback
# and teardown took long enough on 2 busy CPU cores that, without a wait, the bystander exited
# first and was reported (tests/executor/test_failure_report.py's crash run); 5 s is the margin.
LOST_PEER_GRACE_S = 5.0


def lost_peer(err: BaseException) -> bool:
    """Whether `err` is a collective failing because another rank died, not this rank's own fault:
    raised by the communication backend (gloo's transport, NCCL's DistError) and saying a peer is
    gone. A model's own RuntimeError that happens to mention a reset connection is not."""
    import torch.distributed as dist

    text = str(err)
    from_backend = GLOO_TRANSPORT in text or isinstance(err, getattr(dist, "DistError", ()))
    return from_backend and any(t in text for t in LOST_PEER)


def first_line(err: BaseException, max_chars: int = 200) -> str:
    """The first sentence of `err`, without gloo's `[/path/to/pair.cc:553] ` source prefix, cut
    at a word (a gloo error's 250 characters were cut mid-word: "...the remote wo")."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\] ", "", text)
    text = re.split(r"\. (?=[A-Z])", text)[0]  # a sentence ends before a capital ("e.g. x" goes on)
    return text if len(text) <= max_chars else text[:max_chars].rsplit(" ", 1)[0] + " ..."


def main(argv: list[str] | None = None, forked: bool = False) -> None:
    """Train one rank. `forked`: started from the launcher's fork server (run_forked), where the
    agent learns of a success from the function's return, so it returns instead of exiting."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m smplan.executor.worker RUN_CONFIG.json")
    _exit_with_parent()
    sys.stdout = Console(sys.stdout)  # local rank 0's is the console: one closed (`| head`) does not stop the run
    trainer = Trainer(RunConfig.load(argv[0]))
    try:
        trainer.run()
    except (*ONE_LINE_ERRORS, TokenDataError, NonFiniteLossError) as err:  # the launcher shows a failed worker's last lines: this one
        trainer.close()
        print(f"{WORKER_ERROR}{err}", file=sys.stderr, flush=True)
        leave_at_once(1)
    except RuntimeError as err:
        if not lost_peer(err):
            trainer.close()
            raise
        # another rank stopped first (the agent reports that one); this rank's traceback says nothing
        rank = os.environ.get("RANK", "?")
        print(f"{WORKER_ERROR}rank {rank} stopped: {LOST_PEER_LINE} ({first_line(err)})",
              file=sys.stderr, flush=True)
        # the failed rank may still be unwinding its exception: exiting first would make the agent
        # stop it (SIGTERM) and report this rank; it stops this one as soon as that one has exited
        time.sleep(LOST_PEER_GRACE_S)
        leave_at_once(1)
    except BaseException:
        trainer.close()
        raise
    if not forked:
        leave_at_once()  # every rank passed run()'s final barrier; metrics and checkpoints are written


def run_forked(config_path: str) -> None:
    """Entry point of a worker forked from the launcher's fork server (launch.py), which has
    imported torch once for every rank. A success returns: the agent counts a rank done by its
    return value; the process then leaves through os._exit (multiprocessing's forkserver child),
    without the interpreter's teardown, as leave_at_once does. A failure leaves at once."""
    # Ctrl-C reaches the whole foreground process group; the launcher stops the workers with SIGTERM
    # (launch.py), as it does when they run in their own sessions under torchrun
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        main([config_path], forked=True)
    except SystemExit as stop:  # a model's own sys.exit: its code, as a process of its own would end
        if stop.code in (None, 0):
            return  # the agent waits for every rank's return (a bare os._exit(0) would hang it)
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        leave_at_once(stop.code if isinstance(stop.code, int) else 1)
    except BaseException:  # multiprocessing would keep the traceback to itself: the launcher reads it in stderr.log
        traceback.print_exc()
        leave_at_once(1)


if __name__ == "__main__":
    main()
