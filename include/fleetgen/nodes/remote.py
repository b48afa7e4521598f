"""Pure builders of the shell commands fleetgen runs on GPU nodes over SSH.

Nothing here opens a connection: each function returns one string for ``bash -c`` on the node.
Every interpolated value goes through :func:`quote` (``shlex.quote``, with ``~/`` kept expandable),
in every branch, messages included (printed with ``printf %s``, never inside an ``echo "..."``), so
a model path, served name or argument with spaces, quotes, newlines or ``$(...)`` reaches the node as
data. Numbers (ports, pids, sizes) are ``int()``-ed first; what a command reads back from a file on
the node (a pid) is checked to be a number before it is used. The remote user needs no root:
servers run as that user under ``setsid``.

Secrets never appear in a command string nor in a process's command line: the API key travels on the
SSH channel's stdin into a 0600 YAML file that SGLang reads with ``--config`` (commands are logged by
the SSH hook, and ``/proc/PID/cmdline`` is readable by every user of the node):
docs/security-and-ssh.md §1, §2.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Markers that split the output of the multi-part probe command.
SECTION_MARKER = "@@fleetgen:"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set at launch to the server's pid file path: what marks a process as a server we launched (read back from
# /proc/PID/environ), whatever module the fleet file names today. Stop, launch refusal and the probe's
# ours-or-foreign all test it through _is_ours_test.
SERVER_MARKER_ENV = "FLEETGEN_PID_FILE"


def quote(value: str | int | float) -> str:
    """One shell word, exactly ``value``."""
    return shlex.quote(str(value))


def quote_path(value: str) -> str:
    """Like :func:`quote`, except that a leading ``~/`` stays expandable to the remote user's home."""
    text = str(value)
    if text == "~":
        return '"$HOME"'
    if text.startswith("~/"):
        return '"$HOME"/' + shlex.quote(text[2:])
    return shlex.quote(text)


def as_expanded(seen: str, given: str) -> bool:
    """``seen`` (what a process on the node reports) is the path ``given`` as :func:`quote_path` passed it: the same
    text, or, for a ``given`` under ``~/``, that path with the remote user's home expanded in front."""
    return seen == given or (given.startswith("~/") and seen.endswith(given[1:]))


def pid_file(run_dir: str, port: int) -> str:
    return f"{run_dir.rstrip('/')}/sglang-{port}.pid"


def log_file(log_dir: str, port: int) -> str:
    return f"{log_dir.rstrip('/')}/sglang-{port}.log"


def config_file(run_dir: str, port: int) -> str:
    """The server's ``--config`` YAML (mode 0600: it holds the API key). SGLang wants a .yaml suffix."""
    return f"{run_dir.rstrip('/')}/sglang-{port}.yaml"


def api_key_config(key: str) -> str:
    """The YAML that carries the API key to SGLang's ``--config`` (sent on stdin, never in a command).

    SGLang turns each key into ``--<key> <value>`` (sglang/srt/utils/server_args_config_parser.py), so
    the key is spelled ``api-key``; safe_dump quotes whatever YAML would otherwise read as another type.
    """
    import yaml

    if not key or "\n" in key or "\r" in key or key.startswith("-"):
        # argparse would read a leading '-' as a flag; a line break cannot be an HTTP header value.
        raise ValueError("an API key is one line that does not start with '-'")
    return yaml.safe_dump({"api-key": key}, default_flow_style=False, width=1 << 16)


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one server on a node."""

    python: str
    module: str
    model_path: str
    served_name: str
    port: int
    gpu_ids: tuple[int, ...]
    bind_host: str
    run_dir: str
    log_dir: str
    args: tuple[str, ...] = ()          # tuner flags + the user's extra args, already flattened
    env: tuple[tuple[str, str], ...] = ()
    api_key_on_stdin: bool = False       # stdin carries api_key_config(key): written to the server's --config

    def argv(self) -> list[str]:
        """The server's argv (no secrets: with a key, the launch adds ``--config`` naming the file that holds it)."""
        argv = [self.python, "-m", self.module, "--model-path", self.model_path,
                "--served-model-name", self.served_name, "--host", self.bind_host, "--port", str(self.port)]
        # Data-parallel replicas (--dp-size in the args) each take tp_size of the server's GPUs.
        tp_size = len(self.gpu_ids) // dp_size_of_args(self.args)
        if tp_size > 1:
            argv += ["--tp-size", str(tp_size)]
        return argv + list(self.args)


def dp_size_of_args(args: Sequence[str]) -> int:
    """The ``--dp-size`` / ``--data-parallel-size`` value in ``args`` (the last one wins, as in argparse), 1 if absent."""
    size = 1
    for position, arg in enumerate(args):
        name, has_inline, inline = str(arg).partition("=")
        if name in ("--dp-size", "--data-parallel-size"):
            raw = inline if has_inline else (args[position + 1] if position + 1 < len(args) else "1")
            size = int(raw) if str(raw).strip().isdigit() and int(raw) > 0 else 1
    return size


def flags_to_args(flags: Mapping[str, object]) -> list[str]:
    """``{"--mem-fraction-static": 0.93, "--disable-radix-cache": True}`` -> argv words, in key order.

    ``True`` is a bare switch, ``False``/``None`` leave the flag out.
    """
    args: list[str] = []
    for flag, value in flags.items():
        if not flag.startswith("--"):
            raise ValueError(f"flag names start with '--': {flag!r}")
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        else:
            args += [flag, str(value)]
    return args


def _env_name(name: str) -> str:
    """An environment variable name, refused unless it is one (it is written unquoted before ``=``)."""
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    return name


def launch_command(spec: LaunchSpec) -> str:
    """Start one server detached (setsid), output to its log file, pid to its pid file; print the pid.

    A server already holding the pid file's pid with our command line is refused: stop it first.
    """
    port = int(spec.port)
    pid_path, log_path = pid_file(spec.run_dir, port), log_file(spec.log_dir, port)
    env_words = [f"CUDA_VISIBLE_DEVICES={quote(','.join(str(int(g)) for g in spec.gpu_ids))}"]
    env_words += [f"{_env_name(name)}={quote(value)}" for name, value in spec.env]
    env_words.append(f"{SERVER_MARKER_ENV}={quote_path(pid_path)}")
    argv = spec.argv()
    # The interpreter and the model path may live under the remote user's home (~/...).
    server_words = " ".join([quote_path(argv[0]), *(quote(w) for w in argv[1:4]), quote_path(argv[4]),
                             *(quote(w) for w in argv[5:])])
    config_path = quote_path(config_file(spec.run_dir, port))
    if spec.api_key_on_stdin:
        # The key reaches SGLang in a file, not its argv: /proc/PID/cmdline is readable by every local user.
        server_words += f" --config {config_path}"
    lines = [
        "set -eu",
        f"mkdir -p {quote_path(spec.run_dir)} {quote_path(spec.log_dir)}",
        f"if [ -s {quote_path(pid_path)} ] && {_is_ours_test(quote_path(pid_path), spec.module, port)}; then",
        f"  echo \"refused: our server on port {port} is still running (pid $fleetgen_pid)\" >&2",
        "  exit 3",
        "fi",
    ]
    if spec.api_key_on_stdin:
        # A fresh file created 0600 (umask) and never through a planted file or link (noclobber's O_EXCL);
        # cat holds no secret in its own command line.
        lines += [f"rm -f -- {config_path}", f"(umask 077 && set -o noclobber && cat > {config_path})"]
    lines += [
        f": > {quote_path(log_path)}",
        # setsid in a non-interactive shell's background job execs without forking, so $! is the server.
        f"{' '.join(env_words)} setsid {server_words} >> {quote_path(log_path)} 2>&1 < /dev/null &",
        "server_pid=$!",
        f"echo \"$server_pid\" > {quote_path(pid_path)}",
        f"echo \"launched port={port} pid=$server_pid\"",
    ]
    return "\n".join(lines)


def _marked_test(pid_var: str, pid_path_quoted: str) -> str:
    """Shell test: process ``$pid_var`` carries our launch marker naming this pid file (its environment)."""
    return (f"tr '\\0' '\\n' < \"/proc/${pid_var}/environ\" 2>/dev/null | "
            f"grep -qxF -- {quote(SERVER_MARKER_ENV + '=')}{pid_path_quoted}")


def _launched_by_us_test(pid_var: str, pid_path_quoted: str, module: str, port: int) -> str:
    """Shell test: process ``$pid_var`` is alive, on our port, and ours: our marker, or (a server launched
    before the marker existed) our module in its command line."""
    cmdline = f"tr '\\0' ' ' < \"/proc/${pid_var}/cmdline\""
    return (f"[ -r \"/proc/${pid_var}/cmdline\" ] && "
            f"{cmdline} | grep -qF -- {quote(' --port ' + str(int(port)) + ' ')} && "
            f"{{ {_marked_test(pid_var, pid_path_quoted)} || {cmdline} | grep -qF -- {quote('-m ' + module + ' ')}; }}")


def _is_ours_test(pid_path_quoted: str, module: str, port: int) -> str:
    """Shell test: the pid in the file is alive and is a server we launched on our port.

    A pid file can outlive its process and the pid be reused by someone else's program: the marker and
    command line checks are what keep a stop from ever signalling a stranger.
    """
    # The file's content is data: only a plain number is a pid ("$x" or "1 -o 1" must not reach a test).
    return (f"fleetgen_pid=$(head -c 32 -- {pid_path_quoted}) && fleetgen_pid=${{fleetgen_pid%%[[:space:]]*}} && "
            f"case \"$fleetgen_pid\" in ''|*[!0-9]*) false;; esac && "
            + _launched_by_us_test("fleetgen_pid", pid_path_quoted, module, port))


def _find_marked_leader(pid_path_quoted: str, port: int) -> str:
    """Shell: set ``fleetgen_pid`` to the session leader (the server setsid started, not its children, which
    inherit the marker) that carries our marker for this pid file and port; false when none does."""
    # one grep over every readable environment (NUL-separated) finds the candidates; only they are checked
    return ("{ fleetgen_pid=; for fleetgen_environ in $(grep -lzxF -- "
            f"{quote(SERVER_MARKER_ENV + '=')}{pid_path_quoted} /proc/[0-9]*/environ 2>/dev/null); do "
            "fleetgen_proc=${fleetgen_environ%/environ}; fleetgen_candidate=${fleetgen_proc#/proc/}; "
            "if [ \"$(sed 's/.*) //' \"$fleetgen_proc/stat\" 2>/dev/null | cut -d' ' -f4)\" = \"$fleetgen_candidate\" ] && "
            f"tr '\\0' ' ' < \"$fleetgen_proc/cmdline\" | grep -qF -- {quote(' --port ' + str(int(port)) + ' ')}; "
            "then fleetgen_pid=$fleetgen_candidate; break; fi; done; [ -n \"$fleetgen_pid\" ]; }")


def stop_command(*, run_dir: str, module: str, ports: Sequence[int], grace_s: float) -> str:
    """Stop our servers on the given ports: TERM, wait up to grace_s, KILL, every port at once (a server takes
    seconds to exit; one after another, a node's relaunch round would wait for their sum). Prints one line per port:

    ``stopped port=P pid=N signal=TERM|KILL``, ``absent port=P`` (no pid file),
    ``stale port=P pid=N`` (the pid is gone or is not our server: not signalled, pid file removed).
    A server we launched is found by its marker when its pid file is gone (``pid_file=missing``), and one
    launched under another module than ``module`` is stopped too (``module=other``).
    """
    checks = max(1, int(grace_s * 10))
    lines = ["set -u"]
    for port in map(int, ports):
        pid_path = quote_path(pid_file(run_dir, port))
        other_module = (f"tr '\\0' ' ' < \"/proc/$fleetgen_pid/cmdline\" | grep -qF -- {quote('-m ' + module + ' ')}"
                        " && extra= || extra=' module=other'")
        stop = [
            f"  {other_module}",
            "  kill -TERM \"$fleetgen_pid\" 2>/dev/null || true; signal=TERM; n=0",
            f"  while kill -0 \"$fleetgen_pid\" 2>/dev/null && [ $n -lt {checks} ]; do sleep 0.1; n=$((n+1)); done",
            "  if kill -0 \"$fleetgen_pid\" 2>/dev/null; then kill -KILL \"$fleetgen_pid\" 2>/dev/null || true;"
            " signal=KILL; fi",
        ]
        lines += [
            "(",  # each port in a subshell of its own, all waited for below
            # the server's --config holds the API key: it goes whatever the pid file says
            f"rm -f -- {quote_path(config_file(run_dir, port))}",
            f"if [ ! -s {pid_path} ] && {_find_marked_leader(pid_path, port)}; then",
            *stop,
            f"  echo \"stopped port={port} pid=$fleetgen_pid signal=$signal pid_file=missing$extra\"",
            f"elif [ ! -s {pid_path} ]; then echo 'absent port={port}';",
            f"elif {_is_ours_test(pid_path, module, port)}; then",
            *stop,
            f"  rm -f {pid_path}; echo \"stopped port={port} pid=$fleetgen_pid signal=$signal$extra\"",
            # a stale pid file may hold anything: print only its digits, on this one line
            f"else echo \"stale port={port} pid=$(head -c 32 -- {pid_path} | tr -cd 0-9)\"; rm -f {pid_path};",
            "fi",
            ") &",
        ]
    return "\n".join([*lines, "wait"])


def our_pids_command(*, run_dir: str, module: str, ports: Sequence[int]) -> str:
    """Print ``ours port=P pid=N`` for each port whose pid file names a live server of ours."""
    lines = ["set -u"]
    for port in map(int, ports):
        pid_path = quote_path(pid_file(run_dir, port))
        lines.append(f"if [ -s {pid_path} ] && {_is_ours_test(pid_path, module, port)}; then "
                     f"echo \"ours port={port} pid=$fleetgen_pid\"; fi")
    return "\n".join(lines)


def marked_pids_command(*, run_dir: str, ports: Sequence[int]) -> str:
    """Print ``marked port=P pid=N`` for every process carrying our launch marker for a port's pid file: the
    server and the processes it started (SGLang's schedulers hold the GPU memory, and inherit the marker)."""
    lines = ["set -u"]
    for port in map(int, ports):
        marker = f"{quote(SERVER_MARKER_ENV + '=')}{quote_path(pid_file(run_dir, port))}"
        lines.append(f"for fleetgen_environ in $(grep -lzxF -- {marker} /proc/[0-9]*/environ 2>/dev/null); do "
                     "fleetgen_proc=${fleetgen_environ%/environ}; "
                     f"echo \"marked port={port} pid=${{fleetgen_proc#/proc/}}\"; done")
    return "\n".join(lines)


def tail_command(path: str, lines: int = 50) -> str:
    return f"tail -n {int(lines)} -- {quote_path(path)} 2>/dev/null || true"


ALIVE_MARK = "@@fleetgen:alive="


def watch_command(log_path: str, pid: int, lines: int = 50) -> str:
    """The readiness watch: the log's last lines, then ``@@fleetgen:alive=1`` (or ``=0``) for the pid.

    Parse with :func:`parse_watch`. The mark comes last, so its absence means the command was cut short.
    """
    return f"{tail_command(log_path, lines)}; echo {ALIVE_MARK}$(kill -0 {int(pid)} 2>/dev/null && echo 1 || echo 0)"


def parse_watch(output: str) -> tuple[bool | None, list[str]]:
    """Inverse of :func:`watch_command`: (alive, log lines); alive is None when no mark was printed."""
    log_lines = [line for line in output.splitlines() if not line.startswith(ALIVE_MARK)]
    if ALIVE_MARK not in output:
        return None, log_lines
    return f"{ALIVE_MARK}1" in output, log_lines


# SGLang's scheduler lines (scheduler_components/metrics_reporter.py, managers/scheduler.py): the KV tokens
# held, every --decode-log-interval decode steps, and each retraction. The tokens are "#full token: N" on a
# hybrid (Mamba or SWA) model and "#token: N" on a dense one (scheduler_components/pool_stats_observer.py
# get_decode_usage_msg_parts); neither needle is part of the other.
_FULL_TOKEN = "#full token: "
_TOKEN = "#token: "
_RETRACTED = "#retracted_reqs: "


def _peak_rule(needle: str) -> str:
    """The awk rule keeping in ``p`` the largest number that follows ``needle``."""
    return (f"/{needle}[0-9]/ {{ if (match($0, /{needle}[0-9]+/)) {{ "
            f"v = substr($0, RSTART + {len(needle)}, RLENGTH - {len(needle)}) + 0; if (v > p) p = v }} }} ")


def scheduler_log_command(log_dir: str, ports: Sequence[int]) -> str:
    """Per port, one ``scheduler port=P peak_full_tokens=N retracted=M`` line read from the server's log
    (the largest ``#full token`` or ``#token`` of its ``Decode batch`` lines and the sum of
    ``#retracted_reqs``), or ``scheduler port=P missing=1`` without a log. The log holds the last launch
    only (it is truncated at launch)."""
    program = (_peak_rule(_FULL_TOKEN) + _peak_rule(_TOKEN) +
               f"/{_RETRACTED}[0-9]/ {{ if (match($0, /{_RETRACTED}[0-9]+/)) "
               f"r += substr($0, RSTART + {len(_RETRACTED)}, RLENGTH - {len(_RETRACTED)}) }} "
               "END { printf \"scheduler port=%d peak_full_tokens=%d retracted=%d\\n\", port, p, r }")
    lines = []
    for port in ports:
        path = quote_path(log_file(log_dir, int(port)))
        lines.append(f"if [ -r {path} ]; then awk -v port={int(port)} {quote(program)} {path}; "
                     f"else echo 'scheduler port={int(port)} missing=1'; fi")
    return "\n".join(lines)


def read_file_command(path: str, *, max_bytes: int = 64 * 1024 * 1024) -> str:
    """Print a file, failing with a clear message if it is missing or larger than max_bytes."""
    q, shown = quote_path(path), quote(path)  # messages name the path as given, printed as data (printf %s)
    limit = int(max_bytes)
    return (f"if [ ! -r {q} ] || [ -d {q} ]; then printf 'cannot read %s\\n' {shown} >&2; exit 4; fi; "
            f"size=$(wc -c < {q}); if [ \"$size\" -gt {limit} ]; then "
            f"printf '%s is %s bytes, more than %s\\n' {shown} \"$size\" {limit} >&2; exit 5; fi; cat -- {q}")


def sections_command(sections: Mapping[str, str]) -> str:
    """Run several commands in one SSH round trip; the output of each follows a marker line.

    Parse with :func:`split_sections`. Each section's exit status is printed after it.
    """
    parts = []
    for name, command in sections.items():
        parts.append(f"echo {quote(SECTION_MARKER + name)}; ( {command} ); echo \"{SECTION_MARKER}rc=$?\"")
    return "\n".join(parts)


def parse_records(output: str, tags: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
    """The ``TAG key=value ...`` lines the builders above print (``launched``, ``stopped``, ``stale``,
    ``absent``, ``ours``), in order: ``[(tag, {key: value})]``; other lines are ignored."""
    records = []
    for line in output.splitlines():
        words = line.split()
        if words and words[0] in tags:
            records.append((words[0], dict(word.split("=", 1) for word in words[1:] if "=" in word)))
    return records


def split_sections(output: str) -> dict[str, tuple[int, str]]:
    """Inverse of :func:`sections_command`: ``{name: (exit status, output)}``."""
    result: dict[str, tuple[int, str]] = {}
    current: str | None = None
    buffer: list[str] = []
    for line in output.splitlines():
        if line.startswith(SECTION_MARKER):
            tag = line[len(SECTION_MARKER):]
            if tag.startswith("rc=") and current is not None:
                result[current] = (int(tag[3:]), "\n".join(buffer))
                current, buffer = None, []
            else:
                current, buffer = tag, []
        elif current is not None:
            buffer.append(line)
    return result


def sampling_loop_command(query: str, *, interval_s: float, max_seconds: int) -> str:
    """Run ``query`` every ``interval_s`` for at most ``max_seconds`` in ONE remote shell, each output
    preceded by ``@@fleetgen:t=<epoch seconds>`` (read by :func:`timed_sample_time`).

    The loop ends when the SSH channel closes (the next write fails) or after ``max_seconds``, so a
    sampler that dies leaves nothing running on the node. A failing query ends it with its exit status.
    """
    interval = quote(f"{float(interval_s):g}")
    return "\n".join([
        "set -u",
        f"fleetgen_end=$(( $(date +%s) + {int(max_seconds)} ))",
        'while [ "$(date +%s)" -lt "$fleetgen_end" ]; do',
        f'  echo "{SECTION_MARKER}t=$(date +%s.%N)" || exit 0',
        f"  {query} || exit $?",
        f"  sleep {interval}",
        "done",
    ])


def timed_sample_time(line: str) -> float | None:
    """The epoch seconds of a ``@@fleetgen:t=`` line of :func:`sampling_loop_command`, else None."""
    prefix = SECTION_MARKER + "t="
    if not line.startswith(prefix):
        return None
    try:
        return float(line[len(prefix):].strip())
    except ValueError:
        return None


def package_version_command(python: str, module: str) -> str:
    """Print the version of the package that provides ``module`` for ``python`` on the node: the installed
    distribution of that name when there is one (``import sglang`` pulls in torch and transformers: many
    seconds on a busy node), else the package's ``__version__``."""
    package = module.split(".")[0]
    program = ("import importlib, importlib.metadata as metadata, sys\n"
               "try:\n    print(metadata.version(sys.argv[1]))\n"
               "except metadata.PackageNotFoundError:\n    print(importlib.import_module(sys.argv[1]).__version__)")
    return f"{quote_path(python)} -c {quote(program)} {quote(package)}"


# Run on the node by model_identity_command: digests of the files that change what a model writes. A safetensors
# file is an 8-byte little-endian header length, then that many bytes of JSON header (tensor names, dtypes,
# shapes, offsets), then the tensors: its size and header identify it without reading the weights.
_MODEL_IDENTITY_PROGRAM = r"""
import hashlib, json, os, struct, sys
root, tokenizer_root, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
out = {"files": {}, "tokenizer": {"files": {}, "chat_template": None}, "weights": {}, "unreadable": {},
       "template_file": None}
def whole(path):
    digest, block = hashlib.sha256(), bytearray(1 << 20)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(block):
            digest.update(memoryview(block)[:count])
    return digest.hexdigest()
def json_digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
def guard(name, read):
    try:
        return read()
    except (OSError, ValueError, struct.error) as exc:
        out["unreadable"][name] = f"{type(exc).__name__}: {exc}"
if not os.path.isdir(root):
    print(json.dumps({**out, "unreadable": {".": "not a directory"}})); sys.exit(0)
for name in spec["small_files"]:
    if os.path.isfile(os.path.join(root, name)):
        out["files"][name] = guard(name, lambda: whole(os.path.join(root, name)))
for name in spec["tokenizer_files"]:
    path = os.path.join(tokenizer_root, name)
    if not os.path.isfile(path):
        continue
    if name == "tokenizer_config.json":
        def split():
            with open(path, "rb") as handle:
                data = json.load(handle)
            template = data.pop("chat_template", None) if isinstance(data, dict) else None
            out["tokenizer"]["chat_template"] = None if template is None else json_digest(template)
            return json_digest(data)
        out["tokenizer"]["files"][name] = guard(name, split)
    else:
        out["tokenizer"]["files"][name] = guard(name, lambda: whole(path))
if spec["template_file"] and os.path.isfile(os.path.expanduser(spec["template_file"])):
    out["template_file"] = guard("--chat-template", lambda: whole(os.path.expanduser(spec["template_file"])))
def header(path):
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = struct.unpack("<Q", head)[0]
        if length > size - 8:
            raise ValueError(f"header length {length} is beyond the end of the file")
        digest = hashlib.sha256(head + handle.read(length))
        start, span = 8 + length, size - 8 - length
        for block in range(spec["samples"]):  # evenly spread blocks of the tensors: new values of the same shapes
            handle.seek(start + span * block // spec["samples"])
            digest.update(handle.read(spec["sample_bytes"]))
        return digest.hexdigest()
for name in sorted(os.listdir(root)):
    path = os.path.join(root, name)
    if os.path.isfile(path) and name.endswith(".safetensors.index.json"):
        out["files"][name] = guard(name, lambda: whole(path))
    if not (os.path.isfile(path) and name.endswith(".safetensors")):
        continue
    entry = {"bytes": os.path.getsize(path), "sampled_sha256": guard(name, lambda: header(path))}
    if spec["full"]:
        entry["sha256"] = guard(name, lambda: whole(path))
    out["weights"][name] = entry
print(json.dumps(out))
"""


def model_identity_command(python: str, model_path: str, *, tokenizer_root: str, small_files: Sequence[str],
                           tokenizer_files: Sequence[str], template_file: str, full: bool, samples: int,
                           sample_bytes: int) -> str:
    """Print, as one JSON line, the SHA-256 of the model folder's ``small_files`` and ``*.safetensors.index.json``,
    of its tokenizer files (tokenizer_config.json without its chat template, which is hashed apart), of a
    ``--chat-template`` file, and each ``*.safetensors`` file's size and the hash of its header and of
    ``samples`` blocks of ``sample_bytes`` spread over its tensors (with ``full``, of its whole content too).
    Read on the node with ``python``; only digests cross the network."""
    spec = {"small_files": list(small_files), "tokenizer_files": list(tokenizer_files),
            "template_file": template_file, "full": bool(full), "samples": int(samples),
            "sample_bytes": int(sample_bytes)}
    return (f"{quote_path(python)} -c {quote(_MODEL_IDENTITY_PROGRAM)} {quote_path(model_path)} "
            f"{quote_path(tokenizer_root)} {quote(json.dumps(spec))}")
