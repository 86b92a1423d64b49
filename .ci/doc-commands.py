#!/usr/bin/env python3
"""Runs the shell commands that README.md, CONTRIBUTING.md and docs/*.md give,
as written, from a clone of HEAD: every line of every ```sh block is either
run or named in RULES below with why it is not (it needs a GPU, CI runs it
itself, it starts a server, it is too long for CI). A command too long for CI
must also be listed, verbatim, in CONTRIBUTING.md's "Documented commands CI
does not run" (--long runs them too). A block without a language whose lines
read as commands is an error: fence it as ```sh.

    python3 .ci/doc-commands.py           # check, then run the CI commands (CI does)
    python3 .ci/doc-commands.py --list    # what would run, and why the rest does not
    python3 .ci/doc-commands.py --long    # the long ones too

Each block runs as one bash script (set -e) in the clone's root with Go on
PATH: a later line may use what an earlier one built. Exit 1 on the first
failure, naming the document and the block's first line.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", "CONTRIBUTING.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
LONG_LIST = "Documented commands CI does not run"

# First match wins: (regex on the command, kind, why). Kinds: skip (never
# run here), long (run with --long; listed in CONTRIBUTING.md).
RULES = [
    (r"^make (test|check|vet|test-python|check-generate|generate)\b", "skip", "CI runs it itself (.ci/run)"),
    (r"^bash \.ci/cuda-headers\.sh|make (gpu-test|gpu-replay|gpu-bundle|python-cuda)\b", "skip",
     "CI runs it itself: the cuda build against Debian's headers (.ci/run)"),
    (r"^(bash |cd )?\.gpu/|--device cuda", "skip", "needs an NVIDIA GPU (the binaries run on the GPU machine)"),
    (r"^redis-server ", "skip", "starts a server that runs until it is stopped (the Redis tests start their own)"),
    (r"^redis-cli |--tier redis://", "skip", "needs a Redis server at the address it names (docs/operations.md starts one; the Redis tests start their own)"),
    (r"--metrics-addr .*&$|^curl |^go tool pprof ", "skip",
     "a session against a replay serving /metrics while it runs, not a command"),
    (r"\bold\.txt\b", "skip", "a workflow: old.txt is the same benchmark's output on the commit before"),
    (r"^make (fuzz|bench|benchcmp|bench-python)\b", "long", "minutes of benchmarks or fuzzing"),
    (r"-(test\.)?count (6|10)\b(?!.*-benchtime 0\.2s)", "long", "benchmarks, -count 6 or more: minutes each"),
    (r"-bench Policy ", "long", "the eviction policies' simulation: minutes"),
    (r"--pd \S+ (?!.*--workloads)", "long", "the P/D replay of every workload or of the trace, run twice (with and without the tier): minutes"),
    (r"--real-scale|--replicas 4", "long", "a replay at full scale, or four replicas of the Mooncake trace: minutes"),
    (r"^go run golang\.org/x/perf/cmd/benchstat@latest -col /collector s\.txt", "long",
     "compares the output of the long command before it"),
]

COMMANDLIKE = re.compile(r"^(go|make|bash|python3?|/usr/bin/python3|PYTHONPATH=|\./|\.gpu/|redis-|curl) ")


def blocks(doc):
    """(language, first line number, text) of every fenced block of doc."""
    lines = open(os.path.join(ROOT, doc)).read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        out.append((m.group(1), i + 2, lines[i + 1:j]))
        i = j + 1
    return out


def commands(text):
    """The block's commands: backslash continuations joined, blank and
    comment-only lines dropped."""
    out, cur = [], ""
    for line in text:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line
        if cur.endswith("\\"):
            cur = cur[:-1] + "\n"
            continue
        out.append(cur)
        cur = ""
    return out


def bare(cmd):
    """cmd on one line, without a trailing comment."""
    return re.sub(r"\s+#\s.*$", "", " ".join(cmd.split()))


def classify(cmd):
    flat = bare(cmd)
    for rx, kind, why in RULES:
        if re.search(rx, flat):
            return kind, why
    return "run", ""


def plan():
    """Per document and sh block: (doc, line, [(command, kind, why)]);
    the errors found (unfenced commands, long ones not listed)."""
    contributing = open(os.path.join(ROOT, "CONTRIBUTING.md")).read()
    listed = contributing.split("## " + LONG_LIST, 1)[1] if "## " + LONG_LIST in contributing else ""
    out, errors = [], []
    for doc in DOCS:
        for lang, line, text in blocks(doc):
            if lang in ("sh", "bash"):
                cmds = [(c,) + classify(c) for c in commands(text)]
                for c, kind, _ in cmds:
                    if kind == "long" and doc != "CONTRIBUTING.md" and bare(c) not in " ".join(listed.split()):
                        errors.append("%s:%d: a long command not listed in CONTRIBUTING.md's %r: %s" % (doc, line, LONG_LIST, c))
                out.append((doc, line, cmds))
            elif lang == "" and any(COMMANDLIKE.match(t) for t in text):
                errors.append("%s:%d: a block of commands without a language: fence it as ```sh" % (doc, line))
    return out, errors


def clone():
    d = tempfile.mkdtemp(prefix="doc-commands-")
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, d], check=True)
    return d


def main():
    args = sys.argv[1:]
    todo, errors = plan()
    for e in errors:
        print("doc-commands: " + e)
    if errors:
        return 1
    runnable = {"run", "long"} if "--long" in args else {"run"}
    if "--list" in args:
        for doc, line, cmds in todo:
            for c, kind, why in cmds:
                print("%-4s %s:%d: %s%s" % (kind, doc, line, " ".join(c.split()), "  (" + why + ")" if why else ""))
        return 0
    where = clone()
    env = dict(os.environ, PATH="/usr/local/go/bin" + os.pathsep + os.environ.get("PATH", ""))
    seen = set()  # a command given in two documents runs once
    for doc, line, cmds in todo:
        script = [c for c, kind, _ in cmds if kind in runnable and bare(c) not in seen]
        if not script:
            continue
        seen.update(bare(c) for c in script)
        print("== %s:%d" % (doc, line), flush=True)
        for c in script:
            print("$ " + c.replace("\n", " \\\n  "), flush=True)
        t = time.time()
        r = subprocess.run(["bash", "-ec", "\n".join(script)], cwd=where, env=env)
        print("-- %.0f s" % (time.time() - t), flush=True)
        if r.returncode != 0:
            print("doc-commands: %s:%d: exit %d (the clone is kept: %s)" % (doc, line, r.returncode, where))
            return 1
    print("doc-commands: every runnable command of %d documents ran" % len(DOCS))
    shutil.rmtree(where, ignore_errors=True)  # kept when a command failed, to look into
    return 0


if __name__ == "__main__":
    sys.exit(main())
