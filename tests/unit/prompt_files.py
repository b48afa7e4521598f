"""Prompts files written for the tests of fleetgen.prompts: lines, mixed files of valid, rejected and blank lines."""

import json


def chat(prompt_id, text="hello", **extra):
    return {"id": prompt_id, "messages": [{"role": "user", "content": text}], **extra}


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def make_mixed_file(path, kinds):
    """kinds: 'v' valid, 'r' rejected, 'b' blank. Returns the valid ids in order."""
    lines, valid = [], []
    for number, kind in enumerate(kinds):
        if kind == "v":
            record = chat(f"p{number}", "t" * (number % 7 + 1))
            if number % 3 == 0:  # id not first: resume must still find it
                record = {"messages": record["messages"], "id": record["id"]}
            lines.append(record)
            valid.append(f"p{number}")
        elif kind == "r":
            lines.append({"id": f"p{number}", "messages": []})
        else:
            lines.append("   ")
    write_lines(path, lines)
    return valid


def _line(prompt_id, text="q", **extra):
    return json.dumps({"id": prompt_id, "prompt": text, **extra}) + "\n"


def _write(path, lines):
    path.write_text("".join(lines))
    return path
