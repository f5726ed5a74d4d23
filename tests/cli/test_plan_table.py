"""What `plan`'s table prints for a plan at the memory limit."""

from smplan.cli.plan import _gib_down


def test_a_plan_that_fits_never_reads_as_the_gpus_capacity():
    assert _gib_down(79.97) == "79.9"  # printed 80.0/80 with round-to-nearest
    assert _gib_down(80.0) == "80.0" and _gib_down(41.26) == "41.2"
