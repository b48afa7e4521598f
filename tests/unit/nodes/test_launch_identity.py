"""What a launch is known by: the run's identity on the command line, read back from /server_info, and named
in words in an error."""

import pytest

from fleetgen.nodes import launch_identity

RUN = "manual__2026-12-03T22:00:00+00:00"


def test_a_runs_launches_carry_its_id_as_sglangs_weight_version():
    assert launch_identity.launch_args(RUN) == ["--weight-version", "fleetgen/" + RUN]
    with pytest.raises(ValueError, match="^a launch identity needs the run id$"):
        launch_identity.launch_id("")


def test_the_keep_comparison_drops_the_identity_in_both_spellings_and_keeps_everything_else():
    args = ["--tp-size", "2", "--weight-version", "fleetgen/r", "--enable-metrics", "--weight-version=v2", "x"]
    assert launch_identity.without_identity(args) == ["--tp-size", "2", "--enable-metrics", "x"]
    assert launch_identity.without_identity(["--weight-versions", "a"]) == ["--weight-versions", "a"]


def test_the_identity_is_read_from_server_info_only_when_it_is_text():
    assert launch_identity.reported({"weight_version": "fleetgen/r"}) == "fleetgen/r"
    assert launch_identity.reported({"weight_version": 3}) is None
    assert launch_identity.reported({}) is None and launch_identity.reported(None) is None


@pytest.mark.parametrize(("identity", "words"), [
    ("fleetgen/" + RUN, f"launched by run {RUN!r}"),
    ("default", "weight_version 'default': started without fleetgen's launch identity (by hand or another tool)"),
    ("fleetgen/", "weight_version 'fleetgen/': not a launch of fleetgen's"),
    ("v2", "weight_version 'v2': not a launch of fleetgen's"),
    (None, "no weight_version at all (not a server fleetgen launched, or an SGLang without it)"),
])
def test_an_identity_is_named_in_words_saying_who_launched_it(identity, words):
    assert launch_identity.describe(identity) == words
