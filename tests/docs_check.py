#!/usr/bin/env python3
"""The docs check: every command README.md and docs/*.md show is one that works today.

Usage: docs_check.py SOURCE_DIR AIACC_TRAIN_BIN

- Every fenced block has a language tag; ```sh blocks are commands, the others (text, cpp, yaml,
  diff, mermaid, json) are not run.
- In a sh block each line is a command (a trailing backslash joins lines; '#' starts a comment).
  A command that names aiacc_train has the arguments after it parsed by the real binary:
  `aiacc_train --dry-run ARGS` (with the VAR=value assignments before the command in its
  environment) must exit 0. '...' stands for the user's other flags and is dropped (with
  `--data synthetic` added where the line gives no --data: the data is among those flags).
- Any word that starts with a folder of the repository (scripts/, recipes/, ...) must exist.
- Every relative markdown link must resolve to a file of the repository.
- A line ending in '# not checked: WHY' is skipped (WHY must be given).
Prints one line per problem (FILE:LINE: what) and exits 1 when there is any.
"""
import os
import re
import shlex
import subprocess
import sys

REPO_FOLDERS = ("scripts/", "recipes/", "examples/", "tests/", "app/", "comm/", "data/", "models/", "common/",
                "fuzz/", "docs/", "cmake/", ".ci/")
NOT_RUN = {"text", "cpp", "c++", "yaml", "diff", "mermaid", "json", "cmake", "python", "ini", "csv"}
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def commands(lines):
    """(line number, command text) for each command of a sh block, continuations joined."""
    pending, start = "", 0
    for number, line in lines:
        if not pending:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield start, pending + stripped
        pending = ""
    if pending:
        yield start, pending


def words(command):
    """The command's words without its comment; None when it is not to be checked."""
    if re.search(r"#\s*not checked:\s*\S", command):
        return None
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=False)
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError as e:
        raise ValueError(f"cannot split the command: {e}")


def check_command(where, ws, train_bin, src, problems):
    for w in ws:
        path = w.split("=", 1)[1] if w.startswith("--") and "=" in w else w
        if path.startswith(REPO_FOLDERS) and not os.path.exists(os.path.join(src, path.rstrip("/").split(":")[0])):
            problems.append(f"{where}: {path} is not in the repository")
    names = [i for i, w in enumerate(ws) if os.path.basename(w) == "aiacc_train"]
    if not names:
        return
    i = names[0]
    env = dict(os.environ)
    for k in list(env):  # the command's own environment only, not the test runner's launcher variables
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") or \
                k.startswith(("SLURM_", "OMPI_", "PMI_", "PET_", "HOROVOD_", "AIACC_", "TORCHELASTIC_")):
            del env[k]
    j = 0
    while j < i and ASSIGN.match(ws[j]):
        k, v = ws[j].split("=", 1)
        env[k] = v
        j += 1
    args = [a for a in ws[i + 1:] if a != "..."]
    if "..." in ws[i + 1:] and not any(a == "--data" or a.startswith("--data=") for a in args):
        args += ["--data", "synthetic"]  # '...' holds the user's other flags, the data among them
    # Stop at the shell's own syntax: a pipe, a redirection, the next command.
    for k, a in enumerate(args):
        if a in ("|", "||", "&&", ";", "&") or a.startswith((">", "2>", "<")):
            args = args[:k]
            break
    r = subprocess.run([train_bin, "--dry-run"] + args, cwd=src, env=env, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        said = (r.stderr.strip() or r.stdout.strip()).splitlines()
        problems.append(f"{where}: aiacc_train {' '.join(args)}: exit {r.returncode}: {said[-1] if said else ''}")


def check_file(path, src, train_bin, problems):
    rel = os.path.relpath(path, src)
    with open(path, encoding="utf-8") as f:
        text = f.read().splitlines()
    block, lang, body, checked = False, "", [], 0
    for number, line in enumerate(text, 1):
        fence = re.match(r"^\s*```(.*)$", line)
        if fence and not block:
            block, lang, body = True, fence.group(1).strip().split(" ")[0], []
            if not lang:
                problems.append(f"{rel}:{number}: a fenced block without a language tag (sh, text, cpp, ...)")
            elif lang not in NOT_RUN and lang not in ("sh", "bash"):
                problems.append(f"{rel}:{number}: unknown block language '{lang}'")
            continue
        if fence and block:
            block = False
            if lang in ("sh", "bash"):
                for start, command in commands(body):
                    where = f"{rel}:{start}"
                    try:
                        ws = words(command)
                    except ValueError as e:
                        problems.append(f"{where}: {e}")
                        continue
                    if ws:
                        check_command(where, ws, train_bin, src, problems)
                        checked += 1
            continue
        if block:
            body.append((number, line))
            continue
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            file = target.split("#", 1)[0]
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file))):
                problems.append(f"{rel}:{number}: the link {target} leads nowhere")
    if block:
        problems.append(f"{rel}: a fenced block is not closed")
    return checked


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: docs_check.py SOURCE_DIR AIACC_TRAIN_BIN")
    src, train_bin = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    files = [os.path.join(src, "README.md")]
    docs = os.path.join(src, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    problems, checked = [], 0
    for path in files:
        checked += check_file(path, src, train_bin, problems)
    for p in problems:
        print(p)
    print(f"docs_check: {len(files)} files, {checked} commands, {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
