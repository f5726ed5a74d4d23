from smplan.cli.main import cli


def test_hw_list(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "list"])
    assert result.exit_code == 0, result.output
    assert "a100x8" in result.output


def test_unknown_profile_is_one_line_exit_2(cli_runner):
    result = cli_runner.invoke(cli, ["hw", "show", "nope"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown hardware profile" in lines[0]
    assert "Traceback" not in result.output


def test_bad_hw_set_exit_2(cli_runner):
    for bad in ["foo.bar=1", "inter_node.bandwidth_gbps=0", "gpu.memory_gib=lots"]:
        result = cli_runner.invoke(cli, ["hw", "show", "a100x8", "--hw-set", bad])
        assert result.exit_code == 2, (bad, result.output)
        assert "Traceback" not in result.output


def test_version(cli_runner):
    result = cli_runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and "0.1.0" in result.output
