"""Reading the memory-relevant SGLang flags out of a user's extra args."""

import pytest

from fleetgen.errors import ConfigError
from fleetgen.tuning.profile import LaunchOptions


def test_seed_args(cases):
    options = LaunchOptions.from_args(cases.SEED_EXTRA_ARGS)
    assert options.speculative_algorithm == "NEXTN"
    assert (options.speculative_num_steps, options.speculative_eagle_topk,
            options.speculative_num_draft_tokens) == (3, 1, 4)
    assert options.mamba_radix_cache_strategy == "extra_buffer"
    assert options.context_length == 8192 and options.tp_size == 1
    assert options.resolved_spec("Qwen3_5ForConditionalGeneration") == (3, 1, 4)


def test_equals_form_switches_and_unrelated_flags():
    options = LaunchOptions.from_args([
        "--model-path", "/models/x", "--tp-size=2", "--disable-overlap-schedule", "--host", "0.0.0.0",
        "--enable-metrics", "--max-running-requests", "32", "--mem-fraction-static=0.85",
        "--max-total-tokens", "1Mi", "--chunked-prefill-size", "-1", "--kv-cache-dtype", "fp8_e4m3"])
    assert options.tp_size == 2 and options.disable_overlap_schedule
    assert options.max_running_requests == 32 and options.mem_fraction_static == 0.85
    assert options.max_total_tokens == 1 << 20
    assert options.chunked_prefill_size == -1 and options.kv_cache_dtype == "fp8_e4m3"


def test_human_readable_ints_follow_sglang():
    assert LaunchOptions.from_args(["--max-total-tokens", "25.6k"]).max_total_tokens == 25_600
    assert LaunchOptions.from_args(["--max-total-tokens", "2M"]).max_total_tokens == 2_000_000
    with pytest.raises(ConfigError, match="not a number"):
        LaunchOptions.from_args(["--max-total-tokens", "1.5Mi"])


@pytest.mark.parametrize("flag, new_name", [("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
                                            ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")])
def test_old_flag_names_are_refused(flag, new_name):
    with pytest.raises(ConfigError, match=new_name):
        LaunchOptions.from_args([flag, "16"])


@pytest.mark.parametrize("args", [["--pp-size", "2"], ["--enable-dp-attention"], ["--attn-dp-size", "4"]])
def test_unmodeled_parallel_layouts_are_refused(args):
    with pytest.raises(ConfigError, match="not modeled"):
        LaunchOptions.from_args(args)


def test_parallel_size_one_is_fine():
    assert LaunchOptions.from_args(["--dp-size", "1", "--pp-size", "1"]).tp_size == 1


@pytest.mark.parametrize("args, message", [
    (["--tp-size", "two"], "not a number"),
    (["--kv-cache-dtype", "fp4_e2m1"], "not modeled"),
    (["--mamba-ssm-dtype", "int8"], "mamba-ssm-dtype"),
    (["--mem-fraction-static", "1.2"], r"\(0, 1\)"),
    (["--speculative-algorithm", "MEDUSA"], "speculative-algorithm"),
    (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "2"], "need"),
    (["--speculative-algorithm", "NGRAM"], "explicit --speculative-num-draft-tokens"),
    (["--speculative-num-steps", "3"], "--speculative-algorithm is not"),
    (["--context-length"], "has no value"),
])
def test_invalid_values_are_config_errors(args, message):
    with pytest.raises(ConfigError, match=message):
        LaunchOptions.from_args(args)


def test_topk_one_forces_draft_tokens_to_steps_plus_one():
    options = LaunchOptions(speculative_algorithm="EAGLE", speculative_num_steps=5, speculative_eagle_topk=1,
                            speculative_num_draft_tokens=8)
    assert options.resolved_spec("Qwen3NextForCausalLM") == (5, 1, 6)


def test_options_round_trip_through_a_dict(seed_options):
    assert LaunchOptions.from_dict(seed_options.to_dict()) == seed_options
    with pytest.raises(ConfigError, match="unknown field"):
        LaunchOptions.from_dict({"tp_size": 1, "colour": "blue"})


def test_data_and_expert_parallel_and_swa_flags_are_read():
    options = LaunchOptions.from_args(["--dp-size", "2", "--ep", "2", "--disable-hybrid-swa-memory",
                                       "--swa-full-tokens-ratio=0.5"])
    assert (options.dp_size, options.ep_size, options.disable_hybrid_swa_memory,
            options.swa_full_tokens_ratio) == (2, 2, True, 0.5)
    assert options.replace(tp_size=2).gpus_per_server == 4  # tp GPUs for each replica


@pytest.mark.parametrize("ratio", ["0", "1.5"])
def test_swa_full_tokens_ratio_outside_sglangs_range_is_refused(ratio):
    with pytest.raises(ConfigError, match=r"--swa-full-tokens-ratio should be in range \(0, 1.0\]"):
        LaunchOptions.from_args(["--swa-full-tokens-ratio", ratio])
