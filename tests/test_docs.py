"""The docs are checked against the code: every command of this project in a shell block of
README.md, docs/*.md and bench/README.md (`deepspeed_train.py` however it is launched,
`python -m tools.NAME`, `python tools/NAME.py`, `python bench/NAME.py`, `bash scripts/NAME.sh`)
names a script that exists, and every flag it gives is one that script's parser accepts; a flag
renamed in the code fails here. Flags before `deepspeed_train.py` are the launcher's."""
import glob
import importlib
import os
import re
import shlex

import pytest

from testkit.launcher import REPO

DOCS = ["README.md", *sorted(glob.glob(os.path.join("docs", "*.md"))), os.path.join("bench", "README.md")]
SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell|console)?\n(.*?)```", re.S)


def shell_commands(text):
    """The commands of every shell block: continuation lines joined, comments and prompts dropped,
    each command of a `&&`, `;` or `|` chain on its own."""
    for block in SHELL_BLOCK.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            line = line[2:] if line.startswith("$ ") else line
            for command in re.split(r"\s(?:&&|\|\||;|\|)\s", line):
                yield command.strip()


def program_of(words):
    """(kind, name, the words after it) of a command of this project, or None: ("trainer", ...),
    ("tool", "tools.NAME"), ("script", "scripts/NAME.sh"), ("bench", "bench/NAME.py")."""
    for i, word in enumerate(words):
        if word.endswith("deepspeed_train.py"):
            return "trainer", "deepspeed_train.py", words[i + 1:]
        if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("tools."):
            return "tool", words[i + 1], words[i + 2:]
        if re.fullmatch(r"(\./)?tools/\w+\.py", word):
            return "tool", "tools." + os.path.basename(word)[:-3], words[i + 1:]
        if re.fullmatch(r"(\./)?bench/\w+\.(py|sh)", word):
            return "bench", word.lstrip("./"), words[i + 1:]
        if re.fullmatch(r"(\./)?scripts/\w+\.sh", word):
            return "script", word.lstrip("./"), words[i + 1:]
    return None


def accepted_flags(kind, name):
    """The option strings the program's parser accepts (None: no parser to check, a shell script's)."""
    if kind == "trainer":
        import deepspeed

        from utils import get_argument_parser
        parser = deepspeed.add_config_arguments(get_argument_parser())
    elif kind == "tool":
        parser = importlib.import_module(name).build_parser()
    elif kind == "bench" and name.endswith(".py"):
        module = importlib.import_module(name[:-3].replace("/", "."))
        if not hasattr(module, "build_parser"):
            return None
        parser = module.build_parser()
    else:
        return None
    return set(parser._option_string_actions)


def documented_commands():
    found = []
    for doc in DOCS:
        path = os.path.join(REPO, doc)
        if not os.path.isfile(path):
            continue
        for command in shell_commands(open(path, encoding="utf-8").read()):
            try:
                words = shlex.split(command)
            except ValueError:      # an unbalanced quote: the block is prose, not a command
                continue
            program = program_of(words)
            if program is not None:
                found.append((doc, command, *program))
    return found


COMMANDS = documented_commands()


def test_the_docs_hold_commands_of_every_kind():
    kinds = {kind for _, _, kind, _, _ in COMMANDS}
    assert {"trainer", "tool", "script"} <= kinds, kinds
    assert len(COMMANDS) > 20


@pytest.mark.parametrize("doc, command, kind, name, rest", COMMANDS,
                         ids=[f"{doc}:{name}:{i}" for i, (doc, _, _, name, _) in enumerate(COMMANDS)])
def test_a_documented_command_names_a_script_and_flags_that_exist(doc, command, kind, name, rest):
    path = name.replace(".", "/") + ".py" if kind == "tool" else name
    assert os.path.isfile(os.path.join(REPO, path)), f"{doc}: `{command}` names {path}, which does not exist"
    accepted = accepted_flags(kind, name)
    if accepted is None:
        return
    flags = {word.split("=", 1)[0] for word in rest if word.startswith("--") and len(word) > 2}
    unknown = sorted(flag for flag in flags if flag not in accepted)
    assert not unknown, f"{doc}: `{command}` gives {', '.join(unknown)}, which {name} does not accept"


def test_the_configuration_reference_is_the_codes():
    """docs/reference.md is what tools/config_reference.py generates from the parsers and the config
    tables now: a flag, a key or a default changed in the code and not in the page fails here."""
    from tools import config_reference

    with open(config_reference.PAGE, encoding="utf-8") as f:
        written = f.read()
    assert written == config_reference.page(), "docs/reference.md is stale: python -m tools.config_reference --write"



TOOLS = sorted(os.path.basename(path)[:-3] for path in glob.glob(os.path.join(REPO, "tools", "*.py"))
               if not path.endswith("__init__.py"))


@pytest.mark.parametrize("program", ["deepspeed_train.py", *(f"tools.{name}" for name in TOOLS)])
def test_every_help_names_a_guide_that_exists(program):
    """`--help` of the trainer and of every tool ends by naming the guide that explains it
    (`guide: docs/NAME.md`), and that guide exists."""
    kind = "trainer" if program == "deepspeed_train.py" else "tool"
    if kind == "trainer":
        import deepspeed

        from utils import get_argument_parser
        parser = deepspeed.add_config_arguments(get_argument_parser())
    else:
        parser = importlib.import_module(program).build_parser()
    guides = re.findall(r"docs/[\w-]+\.md", parser.format_help())
    assert guides, f"{program} --help names no guide (add epilog=\"guide: docs/NAME.md\" to its parser)"
    for guide in guides:
        assert os.path.isfile(os.path.join(REPO, guide)), f"{program} --help names {guide}, which does not exist"
