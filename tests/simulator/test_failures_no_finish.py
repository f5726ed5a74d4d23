"""Why a run does not finish is named from what the simulation saw, with the options that change it."""

import numpy as np
import pytest
from smplan.simulator.failures import RunDoesNotFinish, RunSpec, analyse_run

HOUR = 3600.0
# 1,024 GPUs of 5,000 h: a failure every 4.9 h, each node out 48 h, so ~10 in repair against 1 spare
STARVED = RunSpec(work_s=30 * 86400.0, num_gpus=1024, gpu_mtbf_hours=5000.0, restart_s=900.0, checkpoint_s=3.6,
                  spares=1, repair_hours=48.0)


def test_a_run_starved_of_spare_nodes_names_the_spare_pool_not_the_checkpoints():
    # It once said "failures come faster than checkpoints can keep up; ... --checkpoint-minutes"
    # for a 3.6 s checkpoint: the same run finishes at 93% without --spares, at 34% with 8.
    with pytest.raises(RunDoesNotFinish) as err:
        analyse_run(STARVED, seeds=10)
    message = str(err.value)
    assert "waiting for a spare node" in message and "--spares 10 or more" in message
    assert "--repair-hours" in message and "about 9.83 are in repair at once against 1 spare node" in message
    assert "--checkpoint-minutes" not in message and "--restart-minutes" not in message


def test_restarts_that_take_most_of_the_time_are_named_as_the_cause():
    from smplan.simulator.failures import no_finish_reason

    spec = RunSpec(work_s=86400.0, num_gpus=8, gpu_mtbf_hours=8.0, restart_s=HOUR, checkpoint_s=1.0)
    message = no_finish_reason(spec, 100 * HOUR, np.zeros(4), np.full(4, 90.0))  # 90 restarts of 1 h in 100 h
    assert "spent 90% of them restarting" in message and "shorten --restart-minutes" in message
    assert "--spares" not in message


def test_otherwise_the_work_lost_between_checkpoints_is_named():
    from smplan.simulator.failures import no_finish_reason

    spec = RunSpec(work_s=86400.0, num_gpus=8, gpu_mtbf_hours=8.0, restart_s=60.0, checkpoint_s=1.0, spares=2)
    message = no_finish_reason(spec, 100 * HOUR, np.full(4, 10 * HOUR), np.full(4, 100.0))  # waits 10%, restarts 17%
    assert "undid the work between checkpoints" in message and "--checkpoint-interval-min" in message
    assert "--spares" not in message
