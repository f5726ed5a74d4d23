"""What `plan`, `plan --explain`, `simulate` and `whatif` print for a plan at the memory limit."""

from smplan.display import memory_gib_text, mfu_percent_text


def test_a_plan_that_fits_never_reads_as_the_gpus_capacity():
    assert memory_gib_text(79.97) == "79.9"  # printed 80.0/80 with round-to-nearest
    assert memory_gib_text(80.0) == "80.0" and memory_gib_text(41.26) == "41.2"


def test_a_tiny_models_mfu_is_under_a_tenth_of_a_percent_not_zero():
    assert mfu_percent_text(0.0003) == "<0.1%"
    assert mfu_percent_text(0.0) == "0.0%"
    assert mfu_percent_text(0.0005) == "0.1%" and mfu_percent_text(0.4567) == "45.7%"
