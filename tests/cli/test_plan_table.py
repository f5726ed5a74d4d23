"""What `plan`, `plan --explain`, `simulate` and `whatif` print for a plan at the memory limit."""

from smplan.display import memory_gib_text


def test_a_plan_that_fits_never_reads_as_the_gpus_capacity():
    assert memory_gib_text(79.97) == "79.9"  # printed 80.0/80 with round-to-nearest
    assert memory_gib_text(80.0) == "80.0" and memory_gib_text(41.26) == "41.2"
