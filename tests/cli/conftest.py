"""Fixtures shared by the CLI tests (`probed`, a CPU profile, is in tests/conftest.py)."""


def fake_runs(monkeypatch, model: str, cluster, factor: float, ran: list | None = None) -> None:
    """calibrate's runs replaced by measurements `factor` x the cost model's step on `cluster`
    (the plans' own list in `ran`, if given): a machine slower than predicted, in milliseconds."""
    from smplan.planner import estimate, profile_model

    from smplan.calibrate.measure import Measured

    def run(plan, label, model_file, steps, nproc, run_dir):
        if ran is not None:
            ran.append(plan)
        profile = profile_model(model, dtype=plan.dtype)
        return Measured(plan, label, factor * estimate(plan, profile, cluster).step_time_s, str(run_dir))

    monkeypatch.setattr("smplan.calibrate.run.run_plan", run)
