"""Review findings on hardware values in the wrong unit (hwprofiles/plausible.py) and the
bundled figures they checked."""

from smplan.hwprofiles import load_cluster


def test_l40s_memory_is_what_cuda_reports_with_ecc_on():
    # nvidia-smi shows 46,068 MiB on an L40S with ECC on: 44.99 GiB, not the datasheet's 48 GB
    assert load_cluster("l40sx8").gpu.memory_gib == 45.0
