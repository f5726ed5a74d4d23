"""The console of a run: the agent's copy of local rank 0's stderr without torch's "[default_role0]:"
prefix or the worker's closing error line (the launcher reports it once), and a console whose reader
left (`smplan execute ... | head -5`) does not stop the run."""

from __future__ import annotations

import io
import os

from smplan.executor.console import Console, agent_line


def test_the_agents_copy_loses_its_prefix_and_the_workers_error_line():
    out = io.StringIO()
    console = Console(out, agent_line)
    console.write("[default_role0]:[rank0]: Traceback (most recent call last):\n")
    console.write("[default_role0]:error: step 3: the loss is NaN or infinite\n")  # the launcher's report says it
    console.write("[default_role0]:error: rank 0 stopped: another rank left the process group (reset)\n")
    console.write("stopping the workers; Ctrl-C once more to leave at once\n")  # the agent's own
    console.write("error: the agent's own line stays\n")
    assert out.getvalue() == ("[rank0]: Traceback (most recent call last):\n"
                              "stopping the workers; Ctrl-C once more to leave at once\n"
                              "error: the agent's own line stays\n")


def test_a_console_whose_reader_left_takes_writes_without_raising():
    read, write = os.pipe()
    os.close(read)  # `| head` has exited
    stream = os.fdopen(write, "w", buffering=1)
    console = Console(stream)
    for step in range(3):
        console.write(f"step {step}/3\n")
        console.flush()
    stream.close()
