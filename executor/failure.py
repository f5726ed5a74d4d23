"""What a failed worker left behind: the end of its exception, read from its stderr log.

The elastic agent keeps every worker's stderr in
`RUN_DIR/elastic/<run id>_<suffix>/attempt_<N>/<local rank>/stderr.log`
(torch.distributed.elastic.multiprocessing.api.DefaultLogsSpecs.reify).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sysconfig
from pathlib import Path

# torch.distributed prefixes a worker's uncaught-exception lines with "[rankN]: "
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_TRACEBACK = "Traceback (most recent call last):"


def stderr_log(logs_root: Path, run_id: str, local_rank: int, error_file: str | None = None) -> Path | None:
    """The stderr log of `local_rank`'s newest attempt in run `run_id` (None when not kept).

    The agent's failure record names the worker's `error.json` only when the worker wrote
    one; otherwise ("<N/A>") the log is found by the agent's folder layout.
    """
    if error_file and Path(error_file).is_absolute():
        beside = Path(error_file).parent / "stderr.log"
        if beside.is_file():
            return beside
    found = [p for p in Path(logs_root).glob(f"{run_id}_*/attempt_*/{local_rank}/stderr.log") if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def exception_tail(text: str, max_lines: int = 10) -> list[str]:
    """The last traceback in `text`, cut to its innermost frames and the exception line(s);
    without a traceback (a C++ abort, a signal), the last non-empty lines."""
    raw = [line.rstrip() for line in text.splitlines()]
    starts = [i for i, line in enumerate(raw) if line.endswith(_TRACEBACK)]
    if not starts:
        return [_RANK_PREFIX.sub("", line) for line in raw if line.strip()][-max_lines:]
    # a traceback's lines carry its header's prefix; lines of other writers (the agent) do not
    prefix = raw[starts[-1]][: -len(_TRACEBACK)]
    block = []
    for line in raw[starts[-1] + 1:]:
        if not line.startswith(prefix):
            break
        block.append(line[len(prefix):])
    # frames are indented; the exception ("ValueError: ...") is the first line that is not
    end = next((i for i, line in enumerate(block) if line and not line[0].isspace()), len(block))
    message = block[end:end + max_lines]
    cause = _dcp_cause(block[end:])
    if cause:  # DCP's exception says only which ranks failed; the first one's exception says why
        message = [message[0], cause][-max_lines:]
    frames = [line for line in block[:end] if line.strip() and set(line.strip()) != {"^"}]
    keep = max_lines - len(message)
    return (frames[-keep:] if keep > 0 else []) + message


# torch.distributed.checkpoint's CheckpointException carries every failed rank's traceback in its
# text, each headed "Traceback (most recent call last): (RANK n)" (torch/distributed/checkpoint/api.py)
_DCP_RANK_TRACEBACK = re.compile(r"^Traceback \(most recent call last\): \(RANK (\d+)\)$")


def _dcp_cause(lines: list[str]) -> str | None:
    """'rank N: <its exception line>' for the first rank traceback in a CheckpointException's text
    (a full disk's OSError, a damaged file's error), or None when `lines` hold none."""
    for i, line in enumerate(lines):
        header = _DCP_RANK_TRACEBACK.match(line.strip())
        if header:
            exc = next((later for later in lines[i + 1:] if later and not later[0].isspace()), None)
            if exc and not _DCP_RANK_TRACEBACK.match(exc.strip()):
                return f"rank {header.group(1)}: {exc}"
    return None


# What a worker prints when a collective failed because another rank died first (executor/worker.py).
LOST_PEER_LINE = "another rank left the process group"


def root_failure(failures: dict, log_of) -> tuple[int, object]:
    """(global rank, failure) to report out of the agent's `failures` (rank -> ProcessFailure):
    the earliest of those that did not merely lose a peer (`log_of(failure)`: its stderr log or
    None). A rank whose peer died can exit before the agent sees the dead one, so the earliest
    failure alone may be the bystander."""
    def lost_a_peer(failure) -> bool:
        log = log_of(failure)
        return log is not None and LOST_PEER_LINE in log.read_text(errors="replace")

    ranked = sorted(failures.items(), key=lambda item: item[1].timestamp)
    return next((item for item in ranked if not lost_a_peer(item[1])), ranked[0])


# How gloo and NCCL say a collective waited past its timeout (torch 2.x: gloo's tcp
# unbound_buffer.cc / pair.cc, ProcessGroupNCCL's watchdog).
TIMEOUT_MARKS = ("Timed out waiting", "Watchdog caught collective operation timeout")
TIMEOUT_HINT = ("a collective timed out: another rank stopped taking part (hung, or far slower) and was "
                "stopped after this one gave up; a crash would have been reported instead")


# The kernel's out-of-memory killer ends a process with SIGKILL, which no handler sees, so the rank
# writes nothing (mm/oom_kill.c; the kernel logs "Out of memory: Killed process N"). A scheduler at
# its time limit sends SIGTERM first, which stops the launcher and is reported as that.
SIGKILL = 9  # POSIX
SIGKILL_HINT = ("signal 9 (SIGKILL) with no error in its log: most often the kernel's out-of-memory killer, "
                "for host memory (`dmesg | grep -i oom` shows it); fewer processes per node, or a node with more "
                "memory, leave each rank more")


def _how(rank: int, exitcode: int) -> str:
    return f"rank {rank} " + (f"killed by signal {-exitcode}" if exitcode < 0 else f"exited with code {exitcode}")


def raised_line(log: Path | None) -> str | None:
    """The exception line of the last traceback in `log`; None without one (a signal, an abort),
    whose last lines say nothing of a cause that could repeat."""
    text = log.read_text(errors="replace") if log is not None else ""
    tail = exception_tail(text, 1) if _TRACEBACK in text else []
    return tail[-1].strip() if tail else None


def failure_line(rank: int, exitcode: int, log: Path | None) -> str:
    """One line: which rank failed, how, and the last line of its exception (when logged)."""
    tail = exception_tail(log.read_text(errors="replace"), 1) if log is not None else []
    return _how(rank, exitcode) + (f": {tail[-1].strip()}" if tail else "")


# smplan's packages (pyproject.toml's [tool.setuptools.package-dir]; smplan.executor is this file's
# folder): their frames are not the user's
SMPLAN_PACKAGES = ("smplan", "smplan.planner", "smplan.simulator", "smplan.hwprofiles")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


@functools.cache
def _not_users_folders() -> tuple[Path, ...]:
    """Python's library, the installed packages' folders and every smplan package's folder."""
    paths = sysconfig.get_paths()
    ours = [Path(__file__).resolve().parent, *(Path(paths[k]).resolve() for k in ("stdlib", "purelib", "platlib"))]
    for name in SMPLAN_PACKAGES:  # in an editable install each is a folder of its own
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            ours.append(Path(spec.origin).resolve().parent)
    return tuple(ours)


def _not_users(path: str) -> bool:
    """Whether a traceback frame's file is Python's, an installed library's or smplan's own."""
    if path.startswith("<") or any(part in path for part in ("/site-packages/", "/dist-packages/")):
        return True
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(folder) for folder in _not_users_folders())


def user_frame(text: str) -> str | None:
    """'FILE, line N, in FUNC' of the innermost frame of the last traceback in `text` that is the
    user's code (not Python's, a library's or smplan's), or None."""
    frames = [m for m in (_FRAME.match(line) for line in exception_tail(text, max_lines=10_000)) if m]
    mine = [m for m in frames if not _not_users(m["path"])]
    return f"{Path(mine[-1]['path']).name}, line {mine[-1]['line']}, in {mine[-1]['func']}" if mine else None


def failure_report(rank: int, exitcode: int, log: Path | None, logs_root: Path, max_lines: int = 10,
                   shown_above: bool = False) -> str:
    """Several lines for the user: which rank failed, how, its exception and its full log.
    `shown_above`: the console already showed the rank's stderr (local rank 0's), traceback and
    all: the report names its exception and the user's frame on one line, not the frames again
    (a caller that sent the console to a file, as calibrate does, still has the log's path)."""
    head = _how(rank, exitcode)
    if log is None:
        return f"{head}; logs under {logs_root}"
    text = log.read_text(errors="replace")
    last = exception_tail(text, 1) if _TRACEBACK in text else []
    if shown_above and last:  # (none: the rank was stopped while it printed the traceback's header)
        exc = last[-1].strip()
        frame = user_frame(text)
        hint = f"\n{TIMEOUT_HINT}" if any(mark in exc for mark in TIMEOUT_MARKS) else ""
        return f"{head}: {exc}" + (f" ({frame})" if frame else "") + f"{hint}\nfull log of rank {rank}, traceback and all: {log}"
    tail = exception_tail(text, max_lines)
    killed = f"\n{SIGKILL_HINT}" if exitcode == -SIGKILL and _TRACEBACK not in text else ""
    if not tail:  # a signal (SIGKILL: out of memory, a scheduler) leaves no exception: one line
        return f"{head}; full log of rank {rank}: {log}{killed}"
    body = "".join(f"\n  | {line}" for line in tail)
    hint = f"\n{TIMEOUT_HINT}" if any(mark in tail[-1] for mark in TIMEOUT_MARKS) else killed
    return f"{head}:{body}{hint}\nfull log of rank {rank}: {log}"
