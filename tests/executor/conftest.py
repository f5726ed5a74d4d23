import pytest

from tests.executor.runs import metrics, run_execute

REFERENCE_STEPS = 6


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The single-process run every plan is held against (same seed, same global batches)."""
    out = tmp_path_factory.mktemp("reference")
    result = run_execute("mbs=1,gbs=4", out, "--steps", str(REFERENCE_STEPS))
    assert result.returncode == 0, result.stdout
    return metrics(out)
