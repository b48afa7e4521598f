"""The run report: figures from the stats and readiness, plots, Markdown, and the previous-run comparison."""
