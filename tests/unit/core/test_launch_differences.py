"""Keep or relaunch: a running server's /server_info against tonight's launch flags, value by value."""

import pytest

from fleetgen.nodes.readiness import LOG_LINE_CHARS, args_as_flags, format_log_excerpt, launch_differences


def test_flags_are_read_with_values_after_a_space_or_an_equals_sign_and_bare_switches():
    args = ["python", "-m", "sglang.launch_server", "--tp-size", "2", "--json-model-override-args={\"a\": \"b=c\"}",
            "--enable-metrics", "--mem-fraction-static", "0.871", "positional", "--disable-radix-cache"]
    assert args_as_flags(args) == {"--tp-size": "2", "--json-model-override-args": "{\"a\": \"b=c\"}",
                                   "--enable-metrics": True, "--mem-fraction-static": "0.871",
                                   "--disable-radix-cache": True}


def test_a_switch_last_on_the_line_is_a_switch():
    assert args_as_flags(["--model-path", "/m", "--enable-metrics"]) == {"--model-path": "/m", "--enable-metrics": True}
    assert args_as_flags(["--a=1=2"]) == {"--a": "1=2"}


def test_the_same_plan_has_no_difference():
    info = {"tp_size": 2, "mem_fraction_static": 0.871, "enable_metrics": True, "kv_cache_dtype": "fp8_e4m3",
            "speculative_algorithm": "EAGLE", "model_path": "/models/m", "disable_cuda_graph": False,
            "enable_mixed_chunk": True, "version": "0.5.23"}
    flags = {"--tp-size": "2", "--mem-fraction-static": "0.871", "--enable-metrics": True,
             "--kv-cache-dtype": "fp8_e4m3", "--speculative-algorithm": "NEXTN", "--model-path": "/models/m",
             "--disable-cuda-graph": "False", "--enable-mixed-chunk": "true"}
    assert launch_differences(info, flags, expected_version="0.5.23") == []


@pytest.mark.parametrize(("flag", "expected", "reported"), [
    ("--tp-size", "2", 4),
    ("--mem-fraction-static", "0.871", 0.87),
    ("--enable-metrics", True, False),
    ("--disable-radix-cache", "false", True),
    ("--kv-cache-dtype", "fp8_e4m3", "auto"),
    ("--model-path", "/models/a", "/models/b"),
    ("--speculative-algorithm", "EAGLE3", "EAGLE"),
])
def test_each_changed_value_is_named_with_both_sides(flag, expected, reported):
    field = flag[2:].replace("-", "_")
    assert launch_differences({field: reported, "version": "v"}, {flag: expected}, expected_version="v") == [
        f"{flag}: running {reported!r}, tonight {expected!r}"]


def test_an_unreported_flag_and_another_version_are_differences():
    assert launch_differences({"version": "0.5.22"}, {"--max-running-requests": "64"}, expected_version="0.5.23") == [
        "--max-running-requests: the server does not report max_running_requests",
        "version: running '0.5.22', installed '0.5.23'"]
    assert launch_differences({"version": "0.5.22"}, {}, expected_version=None) == []


def test_a_long_log_line_is_cut_with_a_mark_and_a_line_at_the_limit_is_not():
    excerpt = format_log_excerpt(["x" * LOG_LINE_CHARS, "y" * (LOG_LINE_CHARS + 1)])
    assert excerpt == f"    | {'x' * LOG_LINE_CHARS}\n    | {'y' * LOG_LINE_CHARS} …"


@pytest.mark.parametrize(("flag", "expected", "reported"), [
    ("--mem-fraction-static", "0.50", 0.5),
    ("--max-running-requests", "64", 64.0),
    ("--chunked-prefill-size", "8192", "8192"),
])
def test_numbers_are_compared_as_numbers(flag, expected, reported):
    field = flag[2:].replace("-", "_")
    assert launch_differences({field: reported}, {flag: expected}, expected_version=None) == []


@pytest.mark.parametrize(("flag", "field"), [("--tensor-parallel-size", "tp_size"), ("--model", "model_path"),
                                             ("--data-parallel-size", "dp_size"),
                                             ("--pipeline-parallel-size", "pp_size")])
def test_an_alias_flag_is_compared_with_the_field_it_sets(flag, field):
    # SGLang reports the field (tp_size), never the alias a user's extra args may spell
    assert launch_differences({field: 2, "version": "v"}, {flag: "2"}, expected_version="v") == []
    assert launch_differences({field: 4, "version": "v"}, {flag: "2"}, expected_version="v") == [
        f"{flag}: running 4, tonight '2'"]
