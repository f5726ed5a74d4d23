"""Writing `--hw-set` values into a copy of a profile's TOML, comments kept."""

import pytest
from smplan.hwprofiles import HardwareProfileError, load_cluster
from smplan.hwprofiles.profile_file import profile_path, with_values


def test_values_land_in_place_and_the_rest_is_kept(tmp_path):
    text = profile_path("a100x8").read_text()
    out = with_values(text, {"inter_node.bandwidth_gbps": 50, "nodes": 4, "gpu.peak_tflops.bf16": 300.5,
                             "cost.source": 'my "quote"'})
    path = tmp_path / "p.toml"
    path.write_text(out)
    c = load_cluster(str(path))
    assert (c.inter_node.bandwidth_gbps, c.nodes, c.gpu.peak_tflops.bf16, c.cost.source) == (50.0, 4, 300.5, 'my "quote"')
    assert c.intra_node == load_cluster("a100x8").intra_node
    changed = [b for a, b in zip(text.splitlines(), out.splitlines(), strict=True) if a != b]
    assert len(changed) == 4 and all(line.endswith("# set by --hw-set") for line in changed)
    assert "bandwidth_gbps = 50  # set by --hw-set" in changed
    assert "# NVIDIA" in out  # the source comments survive


def test_a_key_missing_from_the_file_goes_under_its_table(tmp_path):
    text = profile_path("a100x8").read_text()
    text = text[:text.index("[storage]")]  # the last table; it has defaults
    assert "checkpoint_write_gbps" not in text
    out = with_values(text, {"storage.checkpoint_write_gbps": 2.5})
    path = tmp_path / "p.toml"
    path.write_text(out)
    assert load_cluster(str(path)).storage.checkpoint_write_gbps == 2.5


def test_an_inline_table_cannot_be_edited_and_says_so():
    text = profile_path("a100x8").read_text().replace(
        "[inter_node]\n", "inter_node = { bandwidth_gbps = 25.0, latency_us = 6.0 }\n[inter_node_unused]\n")
    text = "\n".join(line for line in text.splitlines()
                     if not line.startswith(("[inter_node_unused]",)))
    with pytest.raises(HardwareProfileError, match="cannot write inter_node.bandwidth_gbps"):
        with_values(text, {"inter_node.bandwidth_gbps": 50})
