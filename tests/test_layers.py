"""Dependencies point down: the library (turing/) imports none of the scripts above it (the
trainer, the providers, data_worker.py, utils.py, tools/), read from the files themselves."""
import ast
import os

from testkit.launcher import REPO

ROOT_MODULES = {name[:-3] for name in os.listdir(REPO) if name.endswith(".py")} | {"tools", "bench", "tests"}


def imported_modules(path):
    """The top-level names of every module a file imports (at any depth of the file)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def python_files(folder):
    """The .py files below `folder` (sub-packages too), as paths relative to it."""
    return sorted(os.path.relpath(os.path.join(root, name), folder) for root, _, names in os.walk(folder)
                  for name in names if name.endswith(".py"))


def test_the_library_imports_no_script_above_it():
    folder = os.path.join(REPO, "turing")
    files = python_files(folder)   # turing/arch/NAME/ too
    assert len(files) > 20 and "arch/bert/hf.py" in files
    upward = {f: sorted(imported_modules(os.path.join(folder, f)) & ROOT_MODULES) for f in files}
    assert {f: names for f, names in upward.items() if names} == {}


def test_no_tool_imports_the_trainer():
    folder = os.path.join(REPO, "tools")
    files = python_files(folder)
    assert "prep/workers.py" in files
    assert {f for f in files if "deepspeed_train" in imported_modules(os.path.join(folder, f))} == set()


def imported_names(path):
    """Every dotted name a file imports: `import a.b` gives a.b, `from a import b` gives a.b."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_pipeline_stages_import_no_tool_above_them():
    """tools/prep/ is prepare_data's machinery: its stages import each other, the library and
    packages, never a tool (the command line tools/prepare_data.py, or any other) or a script."""
    folder = os.path.join(REPO, "tools", "prep")
    files = python_files(folder)
    assert len(files) > 10

    def above(name):
        top = name.split(".")[0]
        own = name == "tools.prep" or name.startswith("tools.prep.")      # (tools.prepare_data is not)
        return (top == "tools" and not own) or (top in ROOT_MODULES and top != "tools")

    upward = {f: sorted(filter(above, imported_names(os.path.join(folder, f)))) for f in files}
    assert {f: names for f, names in upward.items() if names} == {}


def test_one_way_to_open_a_trained_model():
    """The trainer's --use_pretrain, BertMultiTask.load and every tool read a trained model through
    turing/pretrained.py: no other module reads a checkpoint's, an export's or a state dict file's
    weights itself (the readers' own modules, turing/checkpoint_files.py and turing/hf_folder.py, define
    them), or fakes a run config to borrow the trainer's reader."""
    readers = {}
    calls = ("load_hf_folder(", "hf_folder_config(", "read_state_dict_file(", "load_checkpoint_state(",
             "load_pretrained_weights(SimpleNamespace")
    owners = {os.path.join("turing", name) for name in ("pretrained.py", "checkpoint_files.py", "hf_folder.py")}
    for folder in ("tools", ".", "turing", os.path.join("turing", "arch")):
        for name in python_files(os.path.join(REPO, folder)) if folder != "." else sorted(os.listdir(REPO)):
            path = os.path.normpath(os.path.join(folder, name))
            if name.endswith(".py") and path not in owners:
                text = open(os.path.join(REPO, path), encoding="utf-8").read()
                readers[path] = [call for call in calls if call in text and f"def {call}" not in text]
    assert len(readers) > 60
    assert {f: calls for f, calls in readers.items() if calls} == {}
