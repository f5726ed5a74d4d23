"""The launcher's fork server (executor/launch.py): one per launch, holding that launch's environment."""

from smplan.executor import launch

from tests.executor.env_probe import seen_by_a_forked_process


def test_a_second_launch_forks_from_a_server_with_its_own_environment(monkeypatch):
    monkeypatch.setattr(launch, "FORK_SERVER_PRELOAD", ())  # the mechanism, without importing torch again
    monkeypatch.setenv("SMPLAN_TEST_FORK_SERVER", "first")
    with launch._fork_server():
        assert seen_by_a_forked_process("SMPLAN_TEST_FORK_SERVER") == "first"
    monkeypatch.setenv("SMPLAN_TEST_FORK_SERVER", "second")
    with launch._fork_server():
        # a server kept from the first launch would still hold "first"
        assert seen_by_a_forked_process("SMPLAN_TEST_FORK_SERVER") == "second"


def test_only_the_fork_server_imports_the_module_that_skips_its_teardown():
    """fork_server_exit ends its process with os._exit at exit: a launcher importing it would leave
    without flushing its output or stopping multiprocessing's helpers."""
    import subprocess
    import sys

    probe = ("import sys, smplan.executor, smplan.executor.launch, smplan.executor.worker, smplan.cli.execute; "
             "print('smplan.executor.fork_server_exit' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stdout + result.stderr
    assert "smplan.executor.fork_server_exit" in launch.FORK_SERVER_PRELOAD
