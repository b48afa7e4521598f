"""A run folder without stats files loads as an empty table and says so in the task log."""

import logging

from fleetgen.validation.stats_table import STATS_COLUMNS, load_stats


def test_no_stats_files_is_an_empty_table_and_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="fleetgen.validation.stats_table"):
        stats = load_stats(tmp_path)
    assert stats.empty and list(stats.columns) == list(STATS_COLUMNS)
    assert [record.getMessage() for record in caplog.records] == [f"no stats files under {tmp_path / 'stats'}"]
