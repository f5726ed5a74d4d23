"""A crashing worker: `execute` shows the failing rank's exception and where its full log is."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from smplan.executor.failure import exception_tail, failure_report, stderr_log

from tests.executor.runs import run_execute

CRASHING_MODEL = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x


    def model():
        return Net()


    def batch(micro_batch_size, model=None, seed=0):
        # step 2's micro-batch of dp rank 1 (executor/data.py microbatch_seed, seed 0): a bad sample,
        # met again by every resume from the checkpoint before it
        if seed == 2 * 1_048_576 + 1:
            raise ValueError("boom at step 2")
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(micro_batch_size, 8, generator=gen), torch.randint(0, 8, (micro_batch_size,), generator=gen)


    def loss(out, y):
        return F.cross_entropy(out, y)
''')

LOG = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "<frozen runpy>", line 198, in _run_module_as_main
[rank1]:   File "/x/worker.py", line 35, in main
[rank1]:     trainer.run()
[rank1]:   File "/x/model.py", line 17, in forward
[rank1]:     raise ValueError("boom at step 2")
[rank1]:     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
[rank1]: ValueError: boom at step 2
W1203 09:00:00 12 torch/distributed/elastic/agent.py:1] a later agent line
"""


def test_exception_tail_keeps_the_innermost_frames_and_the_message():
    assert exception_tail(LOG, max_lines=4) == [
        '  File "/x/worker.py", line 35, in main', "    trainer.run()",
        '  File "/x/model.py", line 17, in forward', "    raise ValueError(\"boom at step 2\")",
    ][1:] + ["ValueError: boom at step 2"]


def test_exception_tail_without_traceback_gives_the_last_lines():
    assert exception_tail("a\n\nb\nterminate called without an active exception\n", max_lines=2) == [
        "b", "terminate called without an active exception"]


def test_failure_report_names_the_log(tmp_path):
    for attempt in (0, 1):
        rank_dir = tmp_path / "abc_x1" / f"attempt_{attempt}" / "1"
        rank_dir.mkdir(parents=True)
        (rank_dir / "stderr.log").write_text(LOG)
    log = stderr_log(tmp_path, "abc", 1, error_file="<N/A>")
    assert log == rank_dir / "stderr.log"  # the newest attempt
    assert stderr_log(tmp_path, "other", 1) is None
    text = failure_report(1, 1, log, tmp_path)
    assert text.startswith("rank 1 exited with code 1:")
    assert "ValueError: boom at step 2" in text and f"full log of rank 1: {log}" in text
    assert failure_report(3, -9, None, tmp_path) == f"rank 3 killed by signal 9; logs under {tmp_path}"
    quiet = tmp_path / "quiet.log"
    quiet.write_text("\n")  # SIGKILL: nothing written
    assert failure_report(2, -9, quiet, tmp_path).startswith(f"rank 2 killed by signal 9; full log of rank 2: {quiet}\n")


def test_a_traceback_the_console_showed_is_named_on_one_line_at_the_users_frame(tmp_path):
    """Local rank 0's stderr is on the console as it runs: its report does not repeat the frames,
    it names the exception and the innermost frame of the user's own code (not torch's, not smplan's)."""
    import smplan.executor.failure as failure
    import torch

    library = str(Path(torch.__file__).parent / "nn" / "modules" / "module.py")
    ours = failure.__file__
    log = _write(tmp_path / "stderr.log", LOG.replace(
        '[rank1]: ValueError', f'[rank1]:   File "{library}", line 1789, in _call_impl\n'
                               f'[rank1]:     return forward_call(*args)\n'
                               f'[rank1]:   File "{ours}", line 5, in f\n[rank1]: ValueError'))
    head, path = failure_report(0, 1, log, tmp_path, shown_above=True).splitlines()
    assert head == "rank 0 exited with code 1: ValueError: boom at step 2 (model.py, line 17, in forward)"
    assert path == f"full log of rank 0, traceback and all: {log}"
    assert failure.user_frame("no traceback here") is None
    # stopped while printing the traceback's first line: no exception to name (and no IndexError)
    cut = _write(tmp_path / "cut.log", "[rank0]: Traceback (most recent call last):\n")
    assert failure_report(0, 1, cut, tmp_path, shown_above=True) == f"rank 0 exited with code 1; full log of rank 0: {cut}"
    # a worker's own worded error line was kept off the console: the report still shows it
    worded = _write(tmp_path / "worded.log", "error: the token file holds ids >= vocab\n")
    assert "  | error: the token file holds ids >= vocab" in failure_report(0, 1, worded, tmp_path, shown_above=True)


def test_a_silent_sigkill_is_named_as_the_likely_out_of_memory_kill(tmp_path):
    """The kernel's OOM killer sends SIGKILL, which leaves the rank's log without an error: the
    report says what that most often means, on one line; another signal or a traceback does not get it."""
    quiet = tmp_path / "stderr.log"
    quiet.write_text("")
    head, hint = failure_report(6, -9, quiet, tmp_path).split("\n")
    assert head == f"rank 6 killed by signal 9; full log of rank 6: {quiet}"
    assert hint.startswith("signal 9 (SIGKILL) with no error in its log: most often the kernel's out-of-memory killer")
    assert "dmesg | grep -i oom" in hint and "host memory" in hint and "fewer processes per node" in hint
    quiet.write_text("UserWarning: something harmless\n")  # lines, but no error
    assert failure_report(6, -9, quiet, tmp_path).splitlines()[-2] == hint
    assert "out-of-memory" not in failure_report(6, -11, quiet, tmp_path)  # a segfault is not memory
    quiet.write_text(LOG)
    assert "out-of-memory" not in failure_report(6, -9, quiet, tmp_path)


def test_a_rank_that_lost_its_peer_is_told_apart():
    import torch.distributed as dist
    from smplan.executor.worker import lost_peer

    gloo = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:{}] {} [127.0.0.1]:52451."
    assert lost_peer(RuntimeError(gloo.format(553, "Connection closed by peer")))
    assert lost_peer(RuntimeError(gloo.format(537, "Read error: Connection reset by peer")))
    assert lost_peer(dist.DistBackendError("NCCL communicator was aborted on rank 0."))
    assert not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"))
    # the model's own error that mentions a reset connection is its own failure, not a lost peer
    assert not lost_peer(RuntimeError("reading shard from s3: Connection reset by peer"))


def test_the_root_failure_is_the_earliest_that_did_not_lose_a_peer(tmp_path):
    from types import SimpleNamespace

    from smplan.executor.failure import LOST_PEER_LINE, root_failure

    logs = {0: tmp_path / "0.log", 1: tmp_path / "1.log", 2: tmp_path / "2.log"}
    logs[0].write_text(f"error: rank 0 stopped: {LOST_PEER_LINE} (...)\n")
    logs[1].write_text(LOG)
    logs[2].write_text(f"error: rank 2 stopped: {LOST_PEER_LINE} (...)\n")
    fail = {r: SimpleNamespace(timestamp=t, local_rank=r) for r, t in ((0, 10), (1, 11), (2, 12))}
    log_of = lambda f: logs[f.local_rank]  # noqa: E731
    assert root_failure(fail, log_of)[0] == 1  # rank 0 exited first, as a bystander
    assert root_failure({0: fail[0], 2: fail[2]}, log_of)[0] == 0  # only bystanders: the earliest
    assert root_failure(fail, lambda f: None)[0] == 0  # no logs: the earliest


def test_execute_prints_the_failing_ranks_exception(tmp_path):
    model = tmp_path / "crash.py"
    model.write_text(CRASHING_MODEL)
    out = tmp_path / "run"
    args = ("dp=2,mbs=1,gbs=2", out, "--steps", "3", "--checkpoint-every", "1")
    result = run_execute(*args, model=str(model), timeout=120)
    assert result.returncode == 1, result.stdout
    error = result.stdout[result.stdout.index("training failed"):]
    assert "rank 1 exited with code 1" in error
    assert "ValueError: boom at step 2" in error
    assert 'raise ValueError("boom at step 2")' in error
    logs = list((out / "elastic").glob("*/attempt_0/1/stderr.log"))
    assert len(logs) == 1 and f"full log of rank 1: {logs[0]}" in error
    # the console shows local rank 0's output only (torchrun --local-ranks-filter 0): rank 1's
    # traceback is in its log and in the report above, not echoed line by line
    assert "[rank1]" not in result.stdout and "Traceback" in logs[0].read_text()
    assert "resumes it from its newest checkpoint (step-1)" in error and "same error" not in error
    # the resume meets the same sample: it says so rather than advise the same command again as it is
    again = run_execute(*args, model=str(model), timeout=120)
    assert again.returncode == 1 and "ValueError: boom at step 2" in again.stdout, again.stdout
    repeated = "failed with the same error after the same step as the attempt before it"
    stopped = json.loads((out / "stopped.json").read_text())
    assert repeated in again.stdout and repeated in stopped["detail"], again.stdout
    assert stopped["cause"] == "ValueError: boom at step 2" and stopped["after_step"] == 1, stopped


def test_a_failure_repeats_only_with_the_same_exception_after_the_same_step(tmp_path):
    from smplan.executor.metrics import METRICS_FILE, repeats_stop

    (tmp_path / METRICS_FILE).write_text('{"step": 1}\n{"step": 2}\n')
    before = json.dumps({"reason": "failed", "detail": "...", "cause": "IndexError: x", "after_step": 2}).encode()
    assert repeats_stop(before, tmp_path, "IndexError: x")
    assert not repeats_stop(before, tmp_path, "IndexError: y")  # another error
    assert not repeats_stop(before, tmp_path, None)  # a signal: no exception to compare
    assert not repeats_stop(None, tmp_path, "IndexError: x")  # no attempt before
    assert not repeats_stop(b"{not json", tmp_path, "IndexError: x")
    assert not repeats_stop(before.replace(b'"failed"', b'"interrupted"'), tmp_path, "IndexError: x")
    (tmp_path / METRICS_FILE).write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert not repeats_stop(before, tmp_path, "IndexError: x")  # it got further: not the same failure


def test_a_collective_timeout_says_another_rank_stopped_taking_part(tmp_path):
    log = tmp_path / "stderr.log"
    log.write_text("[rank0]: Traceback (most recent call last):\n"
                   '[rank0]:   File "x.py", line 1, in f\n'
                   "[rank0]: RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                   "Timed out waiting 120000ms for recv operation to complete\n")
    text = failure_report(0, 1, log, tmp_path)
    assert "a collective timed out: another rank stopped taking part (hung, or far slower)" in text
    assert "timed out" not in failure_report(1, 1, _write(tmp_path / "own.log", LOG), tmp_path)


def _write(path, text):
    path.write_text(text)
    return path


def test_a_lost_peer_line_is_its_first_sentence_cut_at_a_word():
    from smplan.executor.worker import first_line

    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
                        "peer [127.0.0.1]:6065. This is typically caused by a remote worker crashing. Check the logs")
    assert first_line(gloo) == "Connection closed by peer [127.0.0.1]:6065"
    assert first_line(RuntimeError("word " * 100), max_chars=22) == "word word word word ..."
    assert first_line(RuntimeError("")) == "RuntimeError"
    assert first_line(RuntimeError("a peer is gone, e.g. killed. Check its log")) == "a peer is gone, e.g. killed"


def test_a_checkpoint_failure_names_the_ranks_own_exception(tmp_path):
    # DCP gathers each rank's traceback into one CheckpointException whose first line names only the
    # ranks: a full disk was reported as "CheckpointException ranks:dict_keys([0, 1])" (review)
    log = "\n".join([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 9, in _save',
        "[rank0]:     dcp.save(state, checkpoint_id=path)",
        "[rank0]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
        "[rank0]: Traceback (most recent call last): (RANK 0)",
        '[rank0]:   File "filesystem.py", line 400, in write_data',
        "[rank0]:     stream.write(data)",
        "[rank0]: OSError: [Errno 28] No space left on device",
        "[rank0]: Traceback (most recent call last): (RANK 1)",
        '[rank0]:   File "filesystem.py", line 400, in write_data',
        "[rank0]: OSError: [Errno 28] No space left on device",
    ])
    assert exception_tail(log, 1) == ["rank 0: OSError: [Errno 28] No space left on device"]
    assert exception_tail(log, 3)[-2:] == [
        "torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([0, 1])",
        "rank 0: OSError: [Errno 28] No space left on device"]
    path = tmp_path / "rank-0.log"
    path.write_text(log)
    assert "rank 0: OSError: [Errno 28] No space left on device" in failure_report(0, 1, path, tmp_path)
