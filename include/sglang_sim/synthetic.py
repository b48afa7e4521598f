"""Deterministic synthetic chat prompts for the demo, tests and benchmarks.

Short chat prompts like the worked case's (~270 prompt tokens on average, some multi-turn),
generated from a seed so every run sees the same file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

_TOPICS = ("graph algorithms", "tidal energy", "Roman law", "protein folding", "compiler design", "jazz harmony",
           "supply chains", "volcanology", "game theory", "medieval trade", "quantum error correction",
           "urban planning", "bird migration", "cryptography", "soil chemistry", "orbital mechanics")
_ASKS = ("Explain step by step how {t} works, with one worked example.",
         "Write a short exam question about {t} and solve it carefully.",
         "Compare two competing views on {t} and say which evidence decides between them.",
         "A student claims a common misconception about {t}. Identify it and correct it with reasoning.",
         "Derive, from first principles, one quantitative result in {t}.")
_FILLER = ("Please be precise and show your reasoning before the final answer. Assume the reader knows "
           "undergraduate mathematics but nothing specific about the field. Keep the final answer short, "
           "and state any assumption you make explicitly. ")


def synthetic_prompt(index: int, seed: int = 0) -> dict:
    rng = random.Random(f"{seed}:{index}")
    topic = rng.choice(_TOPICS)
    first = rng.choice(_ASKS).format(t=topic) + " " + _FILLER * rng.randint(2, 9)
    messages = [{"role": "system", "content": "You are a careful expert tutor."},
                {"role": "user", "content": first.strip()}]
    if rng.random() < 0.25:  # a quarter are multi-turn conversations
        messages += [{"role": "assistant", "content": f"Here is an overview of {topic}. " + _FILLER.strip()},
                     {"role": "user", "content": rng.choice(_ASKS).format(t=topic)}]
    return {"id": f"p{seed:02d}-{index:07d}", "messages": messages}


def write_synthetic_prompts(path: str | Path, count: int, *, seed: int = 0) -> Path:
    """Write ``count`` prompts to ``path`` (atomically: a reader never sees a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    with partial.open("w") as out:
        for index in range(count):
            out.write(json.dumps(synthetic_prompt(index, seed), separators=(",", ":")) + "\n")
    partial.replace(path)
    return path
