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
