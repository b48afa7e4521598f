"""Storage of a run's prompts and outputs: local disk (the default) or an S3-compatible object store.

``location`` reads ``prompts_path`` / ``output_root``; ``objects`` is the one seam to an object store.
"""
