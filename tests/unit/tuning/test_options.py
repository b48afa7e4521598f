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


def test_defaults_are_sglangs_own():
    options = LaunchOptions.from_args([])
    assert options == LaunchOptions()
    assert (options.tp_size, options.dp_size, options.ep_size, options.kv_cache_dtype,
            options.mamba_radix_cache_strategy) == (1, 1, 1, "auto", "auto")
    assert options.gpus_per_server == 1 and not options.spec_enabled and not options.eagle_family
    assert options.resolved_spec("LlamaForCausalLM") is None


@pytest.mark.parametrize("flag, field, value", [
    ("--tensor-parallel-size", "tp_size", 4), ("--data-parallel-size", "dp_size", 2),
    ("--expert-parallel-size", "ep_size", 8), ("--ep-size", "ep_size", 2), ("--page-size", "page_size", 64),
    ("--context-length", "context_length", 32768), ("--max-mamba-cache-size", "max_mamba_cache_size", 96),
    ("--cuda-graph-max-bs-decode", "cuda_graph_max_bs_decode", 160), ("--chunked-prefill-size", "chunked_prefill_size",
                                                                      8192),
    ("--mamba-full-memory-ratio", "mamba_full_memory_ratio", 0.5), ("--quantization", "quantization", "fp8"),
    ("--mamba-ssm-dtype", "mamba_ssm_dtype", "bfloat16"), ("--attention-backend", "attention_backend", "triton"),
    ("--device", "device", "cpu"), ("--mm-feature-transport", "mm_feature_transport", "cuda_ipc"),
    ("--mamba-radix-cache-strategy", "mamba_radix_cache_strategy", "no_buffer"),
])
def test_each_memory_flag_is_read_into_its_field(flag, field, value):
    assert getattr(LaunchOptions.from_args([flag, str(value)]), field) == value
    assert getattr(LaunchOptions.from_args([f"{flag}={value}"]), field) == value


@pytest.mark.parametrize("flag, field", [("--disable-radix-cache", "disable_radix_cache"),
                                         ("--disable-cuda-graph", "disable_cuda_graph"),
                                         ("--language-model-only", "language_model_only"),
                                         ("--disable-overlap-schedule", "disable_overlap_schedule")])
def test_a_switch_takes_no_value_and_the_next_flag_is_still_read(flag, field):
    options = LaunchOptions.from_args([flag, "--page-size", "16"])
    assert getattr(options, field) is True and options.page_size == 16


def test_an_unrelated_flags_value_is_skipped_but_a_flag_after_a_switch_is_not():
    # --host takes a value, --enable-metrics does not: neither value is taken for a memory flag
    options = LaunchOptions.from_args(["--host", "0.0.0.0", "--enable-metrics", "--context-length", "4096",
                                       "--served-model-name=m", "64", "--page-size", "32", "stray"])
    assert options.context_length == 4096 and options.page_size == 32
    assert LaunchOptions.from_args(["--enable-metrics"]) == LaunchOptions()


def test_values_keep_their_spaces_out_and_the_algorithm_is_upper_case():
    options = LaunchOptions.from_args(["--speculative-algorithm", " eagle ", "--speculative-num-steps", " 2 ",
                                       "--kv-cache-dtype", " fp8_e5m2 "])
    assert options.speculative_algorithm == "EAGLE" and options.speculative_num_steps == 2
    assert options.kv_cache_dtype == "fp8_e5m2"


@pytest.mark.parametrize("text, value", [("1k", 1000), ("1.5k", 1500), ("3G", 3 * 10**9), ("2T", 2 * 10**12),
                                         ("2Ki", 2048), ("3Gi", 3 << 30), ("1Ti", 1 << 40), ("64", 64),
                                         ("0.001M", 1000)])
def test_si_suffixes_are_powers_of_ten_and_iec_suffixes_powers_of_two(text, value):
    assert LaunchOptions.from_args(["--max-total-tokens", text]).max_total_tokens == value


@pytest.mark.parametrize("text", ["1K", "1m", "2ki", "1.5Ki", "1e3", "k", "12 k"])
def test_a_suffix_sglang_does_not_read_is_not_a_number(text):
    with pytest.raises(ConfigError, match=rf"--max-total-tokens '{text}' is not a number"):
        LaunchOptions.from_args(["--max-total-tokens", text])


def test_a_float_flag_with_text_is_not_a_number():
    with pytest.raises(ConfigError, match="--mem-fraction-static 'high' is not a number"):
        LaunchOptions.from_args(["--mem-fraction-static", "high"])


def test_an_unmodeled_layout_of_size_one_with_its_value_inline_is_fine():
    assert LaunchOptions.from_args(["--pp-size=1", "--attn-dp-size", " 1 ", "--context-length", "8"]).context_length == 8
    with pytest.raises(ConfigError, match="--pp-size 2 is not modeled by the tuner") as error:
        LaunchOptions.from_args(["--pp-size=2"])
    assert "one tensor-parallel server per GPU group" in error.value.hint
    with pytest.raises(ConfigError, match="attention data parallelism is not modeled") as error:
        LaunchOptions.from_args(["--enable-dp-attention", "--tp-size", "2"])
    assert "--dp-size alone" in error.value.hint


def test_an_old_flag_name_is_refused_with_its_value_inline_too():
    with pytest.raises(ConfigError, match="--cuda-graph-max-bs no longer exists in SGLang 0.5.23") as error:
        LaunchOptions.from_args(["--cuda-graph-max-bs=16"])
    assert error.value.hint == "use --cuda-graph-max-bs-decode instead"


def test_a_flag_at_the_end_without_its_value_is_named():
    with pytest.raises(ConfigError, match="extra SGLang args: --page-size has no value"):
        LaunchOptions.from_args(["--disable-radix-cache", "--page-size"])
    with pytest.raises(ConfigError, match="--pp-size has no value"):
        LaunchOptions.from_args(["--pp-size"])


@pytest.mark.parametrize("changes", [
    {"swa_full_tokens_ratio": 1.0}, {"page_size": 1}, {"chunked_prefill_size": -1}, {"chunked_prefill_size": 1},
    {"mem_fraction_static": 0.999}, {"mem_fraction_static": 0.001}, {"mamba_full_memory_ratio": 0.01},
    {"context_length": 1}, {"max_running_requests": 1}, {"tp_size": 1, "dp_size": 1, "ep_size": 1},
    {"speculative_algorithm": "EAGLE"}, {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 1},
    {"speculative_algorithm": "EAGLE", "speculative_num_steps": 1},
])
def test_options_at_their_limits_are_accepted(changes):
    assert LaunchOptions(**changes).to_dict() == {**LaunchOptions().to_dict(), **changes}


@pytest.mark.parametrize("changes, words", [
    ({"tp_size": 0}, "tp_size must be a positive integer"),
    ({"dp_size": 0}, "dp_size must be a positive integer"),
    ({"ep_size": 2.0}, "ep_size must be a positive integer"),
    ({"tp_size": True}, "tp_size must be a positive integer"),
    ({"page_size": True}, "page_size must be a positive integer"),
    ({"swa_full_tokens_ratio": 0.0}, r"--swa-full-tokens-ratio should be in range \(0, 1.0\]"),
    ({"swa_full_tokens_ratio": 1.0001}, r"--swa-full-tokens-ratio should be in range"),
    ({"page_size": 0}, "page_size must be a positive integer"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 0}, "speculative_num_steps must be"),
    ({"max_total_tokens": 0}, "max_total_tokens must be a positive integer"),
    ({"cuda_graph_max_bs_decode": 1.5}, "cuda_graph_max_bs_decode must be a positive integer"),
    ({"chunked_prefill_size": 0}, r"chunked_prefill_size must be positive or -1 \(off\), got 0"),
    ({"chunked_prefill_size": -2}, "chunked_prefill_size must be positive or -1"),
    ({"chunked_prefill_size": 2.0}, "chunked_prefill_size must be positive or -1"),
    ({"mem_fraction_static": 1.0}, r"--mem-fraction-static must lie in \(0, 1\), got 1.0"),
    ({"mem_fraction_static": 0.0}, r"--mem-fraction-static must lie in \(0, 1\)"),
    ({"mamba_full_memory_ratio": 0.0}, "--mamba-full-memory-ratio must be positive, got 0.0"),
    ({"mamba_radix_cache_strategy": "lazy"}, "--mamba-radix-cache-strategy 'lazy' is not one of"),
    ({"speculative_algorithm": "eagle"}, "--speculative-algorithm 'eagle' is not one of"),
    ({"speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 4}, "need --speculative-num-steps too"),
    ({"speculative_eagle_topk": 1}, "--speculative-algorithm is not"),
    ({"speculative_num_draft_tokens": 4}, "--speculative-algorithm is not"),
])
def test_options_past_their_limits_are_config_errors(changes, words):
    with pytest.raises(ConfigError, match=words) as error:
        LaunchOptions(**changes)
    assert str(error.value).startswith("SGLang launch options: ")


def test_the_swa_ratio_refusal_says_how_to_fix_it():
    with pytest.raises(ConfigError) as error:
        LaunchOptions(swa_full_tokens_ratio=2.0)
    assert error.value.hint == "drop --swa-full-tokens-ratio or give a value in (0, 1]"
    with pytest.raises(ConfigError) as error:
        LaunchOptions(kv_cache_dtype="int4")
    assert "fp8_e4m3" in error.value.hint


@pytest.mark.parametrize("algorithm, architecture, expected", [
    ("EAGLE", "LlamaForCausalLM", (5, 4, 8)),          # _auto_choose_speculative_params' Llama defaults
    ("NEXTN", "Grok1ForCausalLM", (5, 4, 8)),
    ("EAGLE3", "Qwen3NextForCausalLM", (3, 1, 4)),
    ("STANDALONE", "LlamaForCausalLM", (3, 1, 4)),      # STANDALONE ignores the architecture's defaults
])
def test_the_eagle_family_with_nothing_set_takes_sglangs_automatic_choice(algorithm, architecture, expected):
    assert LaunchOptions(speculative_algorithm=algorithm).resolved_spec(architecture) == expected


def test_explicit_eagle_steps_fill_in_the_rest_as_sglang_does():
    steps_only = LaunchOptions(speculative_algorithm="EAGLE", speculative_num_steps=4)
    assert steps_only.resolved_spec("LlamaForCausalLM") == (4, 1, 5)  # top-k 1, drafts = steps + 1
    tree = LaunchOptions(speculative_algorithm="EAGLE", speculative_num_steps=4, speculative_eagle_topk=2)
    assert tree.resolved_spec("LlamaForCausalLM") == (4, 2, 5)
    given = LaunchOptions(speculative_algorithm="EAGLE", speculative_num_steps=4, speculative_eagle_topk=2,
                          speculative_num_draft_tokens=16)
    assert given.resolved_spec("LlamaForCausalLM") == (4, 2, 16)
    assert given.eagle_family and given.spec_enabled


def test_other_algorithms_take_one_step_and_one_branch_unless_given():
    ngram = LaunchOptions(speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)
    assert ngram.resolved_spec("LlamaForCausalLM") == (1, 1, 8) and not ngram.eagle_family
    given = LaunchOptions(speculative_algorithm="DFLASH", speculative_num_steps=3, speculative_eagle_topk=2,
                          speculative_num_draft_tokens=8)
    assert given.resolved_spec("LlamaForCausalLM") == (3, 2, 8)


def test_a_server_holds_tp_gpus_for_each_data_parallel_replica():
    assert LaunchOptions(tp_size=4, dp_size=2).gpus_per_server == 8
    assert LaunchOptions(tp_size=3).replace(dp_size=3).gpus_per_server == 9
    with pytest.raises(ConfigError):
        LaunchOptions().replace(tp_size=0)


@pytest.mark.parametrize("name", ["dp_size", "chunked_prefill_size", "max_running_requests", "context_length"])
def test_a_json_true_from_a_plans_inputs_is_not_a_size(name):
    data = {**LaunchOptions().to_dict(), name: True}
    with pytest.raises(ConfigError, match=f"{name} must be"):
        LaunchOptions.from_dict(data)


def test_args_that_are_not_strings_are_read_as_their_text():
    options = LaunchOptions.from_args(["--tp-size", 2, "--mem-fraction-static", 0.8])
    assert options.tp_size == 2 and options.mem_fraction_static == 0.8


def test_unknown_fields_are_named_in_order():
    with pytest.raises(ConfigError) as error:
        LaunchOptions.from_dict({"tp_size": 1, "zeta": 1, "alpha": 2})
    assert str(error.value) == "SGLang launch options: unknown field(s) ['alpha', 'zeta']"


def test_attention_data_parallelism_is_refused_with_the_whole_reason():
    with pytest.raises(ConfigError) as error:
        LaunchOptions.from_args(["--enable-dp-attention"])
    assert str(error.value) == ("extra SGLang args: attention data parallelism is not modeled by the tuner (its weights "
                                "per GPU and per-group pools)\nWhat to check next: drop --enable-dp-attention "
                                "(--dp-size alone runs independent replicas), or plan this server by hand")


@pytest.mark.parametrize("changes, message", [
    ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2},
     "--speculative-eagle-topk / --speculative-num-draft-tokens need --speculative-num-steps too (SGLang chooses all "
     "three or none)"),
    ({"speculative_algorithm": "NGRAM"},
     "--speculative-algorithm NGRAM needs an explicit --speculative-num-draft-tokens: its default is not modeled here"),
    ({"speculative_num_steps": 2}, "speculative steps/top-k/draft tokens are set but --speculative-algorithm is not"),
    ({"swa_full_tokens_ratio": 0.0}, "--swa-full-tokens-ratio should be in range (0, 1.0].\nWhat to check next: drop "
                                     "--swa-full-tokens-ratio or give a value in (0, 1]"),
])
def test_speculative_and_swa_refusals_say_it_whole(changes, message):
    with pytest.raises(ConfigError) as error:
        LaunchOptions(**changes)
    assert str(error.value) == f"SGLang launch options: {message}"


def test_a_pipeline_layout_is_refused_with_the_whole_reason():
    with pytest.raises(ConfigError) as error:
        LaunchOptions.from_args(["--pp-size", "4"])
    assert str(error.value) == ("extra SGLang args: --pp-size 4 is not modeled by the tuner (pipeline / attention-DP "
                                "parallelism)\nWhat to check next: run one tensor-parallel server per GPU group, or "
                                "plan by hand")
