"""SGLang 0.5.23 flag parsing: old names fail exactly as argparse fails them."""

import pytest

from sglang_sim.args import human_int, parse_args


def _fail(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model-path", "m", *argv])
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()[-1]


def test_old_cuda_graph_flag_is_ambiguous(capsys):
    code, line = _fail(["--cuda-graph-max-bs", "16"], capsys)
    assert code == 2
    assert line == ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
                    "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill")


def test_old_mamba_strategy_flag_is_unrecognized(capsys):
    code, line = _fail(["--mamba-scheduler-strategy", "extra_buffer"], capsys)
    assert code == 2
    assert line == "sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"


def test_abbreviations_and_aliases_resolve():
    args = parse_args(["--model", "m", "--tp", "2", "--dp", "1", "--speculative-algorithm", "NEXTN",
                       "--max-total-tokens", "800k", "--tensor-parallel-size", "4"])
    assert args.model_path == "m" and args.tp_size == 4 and args.speculative_algorithm == "NEXTN"
    assert args.max_total_tokens == 800_000


def test_human_int():
    assert human_int("1.5M") == 1_500_000 and human_int("4096") == 4096
    with pytest.raises(Exception):
        human_int("lots")


def test_model_path_is_required(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--port", "1"])
    assert exit_info.value.code == 2
    assert "the following arguments are required: --model-path/--model" in capsys.readouterr().err
