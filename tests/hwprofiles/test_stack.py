"""Software-stack profiles: bundled and user files, one-line errors, precedence under --hw-set."""

import dataclasses

import pytest
from smplan.hwprofiles import (
    DEFAULT_STACK,
    STACK_KEYS,
    Efficiency,
    HardwareProfileError,
    StackError,
    bundled_stacks,
    load_cluster,
    load_stack,
    read_stack,
    with_stack,
)
from smplan.hwprofiles.loader import PROFILE_DIR
from smplan.hwprofiles.stack import STACK_DIR, stack_toml, write_stack

HOST = "efficiency.host_overhead_us_per_layer"


def _stack_file(tmp_path, name="slow", host=50000.0, fusion=0.25, overlap=False, extra=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nhost_overhead_us_per_layer = {host}\nelementwise_fusion = {fusion}\n'
                    f"overlap_grad_reduce = {'true' if overlap else 'false'}\n{extra}")
    return path


def _hw_with_efficiency(tmp_path, table: str):
    """a100x8 as an old calibrated file would be: the bundled TOML plus its own [efficiency]."""
    path = tmp_path / "calibrated.toml"
    path.write_text((PROFILE_DIR / "a100x8.toml").read_text() + f"\n[efficiency]\n{table}\n")
    return path


def test_the_four_bundled_stacks_load():
    assert bundled_stacks() == ["megatron-core", "megatron-deepspeed", "pytorch-fsdp", "torchtitan"]
    assert DEFAULT_STACK in bundled_stacks()
    for name in bundled_stacks():
        stack = load_stack(name)
        assert stack.name == name and stack.description and stack.source == f"bundled stack {name!r}"
        assert stack.host_overhead_us_per_layer >= 0 and 0 <= stack.elementwise_fusion <= 1
        assert isinstance(stack.overlap_grad_reduce, bool)
    assert load_stack(None) == load_stack(DEFAULT_STACK)


def test_every_bundled_value_cites_its_source():
    for path in STACK_DIR.glob("*.toml"):
        for key in ("host_overhead_us_per_layer", "elementwise_fusion", "overlap_grad_reduce"):
            line = next(line for line in path.read_text().splitlines() if line.startswith(key))
            assert "#" in line and len(line.split("#", 1)[1].strip()) > 20, (path.name, line)


def test_the_default_stack_is_what_a_plain_load_gets():
    plain, named = load_cluster("a100x8"), load_cluster("a100x8", stack=DEFAULT_STACK)
    assert plain == named
    for key, value in load_stack().efficiency().items():
        assert getattr(plain.efficiency, key) == value


def test_a_stack_file_by_path(tmp_path):
    path = _stack_file(tmp_path)
    stack = load_stack(str(path))
    assert (stack.name, stack.host_overhead_us_per_layer, stack.elementwise_fusion, stack.overlap_grad_reduce) == (
        "slow", 50000.0, 0.25, False)
    assert stack.source == f"stack file {str(path)!r}" and stack.description == ""
    assert read_stack(str(path))["host_overhead_us_per_layer"] == 50000.0


def test_name_defaults_to_the_file_name(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\n")
    assert load_stack(str(path)).name == "mine"


@pytest.mark.parametrize("ref, expected", [
    ("nope", "unknown stack 'nope'; use one of megatron-core, megatron-deepspeed, pytorch-fsdp, torchtitan"),
    ("missing/dir/x.toml", "does not exist"),
])
def test_bad_name_or_path_is_one_line(ref, expected):
    with pytest.raises(StackError) as err:
        load_stack(ref)
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, HardwareProfileError)  # callers that catch profile errors catch these


@pytest.mark.parametrize("body, expected", [
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nmatmul_max = 0.7\n",
     "unknown key 'matmul_max'; valid keys: name, description, host_overhead_us_per_layer, elementwise_fusion, "
     "overlap_grad_reduce"),
    ("host_overhead_us_per_layer = 1\noverlap_grad_reduce = true\n", "missing key 'elementwise_fusion'"),
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1.5\noverlap_grad_reduce = true\n",
     "'elementwise_fusion' must be a number from 0 to 1"),
    ("host_overhead_us_per_layer = -3\nelementwise_fusion = 1\noverlap_grad_reduce = true\n",
     "'host_overhead_us_per_layer' must be a number from 0"),
    ("host_overhead_us_per_layer = nan\nelementwise_fusion = 1\noverlap_grad_reduce = true\n",
     "'host_overhead_us_per_layer' must be a number"),
    ('host_overhead_us_per_layer = "fast"\nelementwise_fusion = 1\noverlap_grad_reduce = true\n',
     "'host_overhead_us_per_layer' must be a number"),
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = 1\n",
     "'overlap_grad_reduce' must be true or false"),
    ("name = 3\nhost_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\n",
     "'name' must be text"),
    ("host_overhead_us_per_layer = \n", "is not valid TOML"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nattention_kernel = "fa9"\n',
     "'attention_kernel' must be one of flash1, flash2, cudnn"),
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nzero3_max_live_params = -1\n",
     "'zero3_max_live_params' must be a number from 0"),
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nsingle_nic_network = 2\n",
     "'single_nic_network' must be a number from 0.001 to 1"),
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nep_a2a_overlap = 1.5\n",
     "'ep_a2a_overlap' must be a number from 0 to 1"),
    ("host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\ntp_comm_overlap = -1\n",
     "'tp_comm_overlap' must be a number from 0 to 1"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nzero_collectives = "tree"\n',
     "'zero_collectives' must be one of per_nic, ring"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\ngrad_reduce_dtype = "bf16"\n',
     "'grad_reduce_dtype' must be one of weights, fp32"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nzero_granularity = "layer"\n',
     "'zero_granularity' must be one of bucket, block"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nep_dispatcher = "deepep"\n',
     "'ep_dispatcher' must be one of all_to_all, node_dedup"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\npp_send = "half"\n',
     "'pp_send' must be one of full, tp_slice"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\nsp_saved_input = "full"\n',
     "'sp_saved_input' must be one of shard, gathered"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\ncross_entropy = "fused"\n',
     "'cross_entropy' must be one of in_place, traced"),
    ('host_overhead_us_per_layer = 1\nelementwise_fusion = 1\noverlap_grad_reduce = true\n'
     'host_overhead_us_per_moe_layer = "x"\n', "'host_overhead_us_per_moe_layer' must be a number from 0"),
])
def test_bad_stack_file_is_one_line(tmp_path, body, expected):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(StackError) as err:
        load_stack(str(path))
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_stack_replaces_the_profile_and_hw_set_wins_over_the_stack(tmp_path):
    slow = str(_stack_file(tmp_path))
    cluster = load_cluster("a100x8", stack=slow)
    assert cluster.efficiency.host_overhead_us_per_layer == 50000.0 and cluster.efficiency.elementwise_fusion == 0.25
    rest = {k: v for k, v in dataclasses.asdict(cluster.efficiency).items() if k not in STACK_KEYS}
    assert rest == {k: v for k, v in dataclasses.asdict(Efficiency()).items() if k not in STACK_KEYS}
    over = load_cluster("a100x8", stack=slow, overrides=[f"{HOST}=7"])
    assert over.efficiency.host_overhead_us_per_layer == 7 and over.efficiency.elementwise_fusion == 0.25


def test_a_hardware_file_that_states_a_stack_key(tmp_path):
    """An old calibrated profile keeps its value under the default stack (named or not); any
    other stack replaces it; --hw-set wins over both."""
    hw = str(_hw_with_efficiency(tmp_path, "host_overhead_us_per_layer = 300.0"))
    default_fusion = load_stack().elementwise_fusion
    for stack in (None, DEFAULT_STACK):
        eff = load_cluster(hw, stack=stack).efficiency
        assert eff.host_overhead_us_per_layer == 300.0 and eff.elementwise_fusion == default_fusion
    assert load_cluster(hw, stack=str(_stack_file(tmp_path))).efficiency.host_overhead_us_per_layer == 50000.0
    torchtitan = load_stack("torchtitan").host_overhead_us_per_layer
    assert load_cluster(hw, stack="torchtitan").efficiency.host_overhead_us_per_layer == torchtitan
    assert load_cluster(hw, overrides={HOST: 9.0}).efficiency.host_overhead_us_per_layer == 9.0


def test_with_stack_keeps_the_named_keys(tmp_path):
    cluster, stack = load_cluster("h100x8"), load_stack(str(_stack_file(tmp_path)))
    both = with_stack(cluster, stack)
    assert both.efficiency.host_overhead_us_per_layer == 50000.0 and both.efficiency.elementwise_fusion == 0.25
    kept = with_stack(cluster, stack, keep=["host_overhead_us_per_layer"])
    assert kept.efficiency.host_overhead_us_per_layer == cluster.efficiency.host_overhead_us_per_layer
    assert kept.efficiency.elementwise_fusion == 0.25 and kept.gpu == cluster.gpu


def test_a_written_stack_reads_back(tmp_path):
    stack = dataclasses.replace(load_stack("torchtitan"), name="mine", description='says "hi"',
                                host_overhead_us_per_layer=123.456)
    text = stack_toml(stack, ["fitted here"], {"host_overhead_us_per_layer": "fitted", "elementwise_fusion": "kept"})
    out = tmp_path / "mine.toml"
    write_stack(text, out)
    back = load_stack(str(out))
    assert dataclasses.replace(back, source="") == dataclasses.replace(stack, source="")
    assert "# fitted here" in out.read_text() and "123.456  # fitted" in out.read_text()
    with pytest.raises(HardwareProfileError, match="--force"):
        write_stack(text, out)
    write_stack(text, out, force=True)
    with pytest.raises(StackError, match="would not load"):
        write_stack("name = 1\n", tmp_path / "bad.toml")
    assert not (tmp_path / "bad.toml").exists()


def test_the_stack_names_its_attention_kernel_and_zero3_gather_cap(tmp_path):
    """Megatron-Core runs TE's cuDNN attention, torchtitan SDPA's FlashAttention-2; DeepSpeed caps
    ZeRO-3's gathered parameters at stage3_max_live_parameters. A user file may leave both out."""
    kernels = {s: load_cluster("h100x8", stack=s).efficiency.attention_kernel for s in bundled_stacks()}
    assert kernels == {"megatron-core": "cudnn", "megatron-deepspeed": "flash2", "pytorch-fsdp": "flash2",
                       "torchtitan": "flash2"}
    assert load_cluster("a100x8", stack="megatron-deepspeed").efficiency.zero3_max_live_params == 1e9
    nic = {s: load_cluster("a100x8", stack=s).efficiency.single_nic_network for s in bundled_stacks()}
    assert nic == {"megatron-core": 0.66, "megatron-deepspeed": 0.66, "pytorch-fsdp": 0.85, "torchtitan": 0.85}
    rails = {s: load_cluster("a100x8", stack=s).efficiency.zero_collectives for s in bundled_stacks()}
    assert rails == {"megatron-core": "ring", "megatron-deepspeed": "per_nic", "pytorch-fsdp": "ring",
                     "torchtitan": "ring"}
    units = {s: load_cluster("a100x8", stack=s).efficiency.zero_granularity for s in bundled_stacks()}
    assert units == {"megatron-core": "bucket", "megatron-deepspeed": "bucket", "pytorch-fsdp": "block",
                     "torchtitan": "block"}
    reduce = {s: load_cluster("a100x8", stack=s).efficiency.grad_reduce_dtype for s in bundled_stacks()}
    assert reduce == {"megatron-core": "weights", "megatron-deepspeed": "weights", "pytorch-fsdp": "weights",
                      "torchtitan": "fp32"}
    sends = {s: load_cluster("a100x8", stack=s).efficiency.pp_send for s in bundled_stacks()}
    assert sends == {"megatron-core": "full", "megatron-deepspeed": "tp_slice", "pytorch-fsdp": "full", "torchtitan": "full"}
    kept = {s: load_cluster("a100x8", stack=s).efficiency.sp_saved_input for s in bundled_stacks()}
    assert kept == {"megatron-core": "shard", "megatron-deepspeed": "shard", "pytorch-fsdp": "gathered",
                    "torchtitan": "gathered"}
    losses = {s: load_cluster("a100x8", stack=s).efficiency.cross_entropy for s in bundled_stacks()}
    assert losses == {"megatron-core": "in_place", "megatron-deepspeed": "in_place", "pytorch-fsdp": "traced",
                      "torchtitan": "traced"}
    plain = load_stack(str(_stack_file(tmp_path)))
    assert (plain.attention_kernel, plain.zero3_max_live_params) == ("flash2", 0.0)
    assert load_stack(str(_stack_file(tmp_path, name="fa1", extra='attention_kernel = "flash1"\n'))).attention_kernel == "flash1"
