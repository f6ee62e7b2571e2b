"""A training run's decisions exist once: one map from a ZeRO stage to its engine, one list of
precision names (and one master dtype), one set of defaults that ``minipar train``'s flags are
made from. Each rule reads the source with ``ast`` and is shown to fail on a planted second copy.
(docs/developing.md, "The house"; ``minipar.train.parallelize`` reads the three.)"""
from __future__ import annotations

import ast

from minipar.cli.train import FLAGS, config_from, default_of, field_of, flag_default, shown
from minipar.mixed_precision import MASTER, PRECISIONS
from minipar.train.config import DEFAULT_MODEL, TrainConfig
from minipar.train.model import GPTConfig
from minipar.zero import STAGES

from .test_house import read_tree

ENGINES = {cls.__name__ for cls in STAGES.values()}  # DDP, ZeRO1, ZeRO2, ZeRO3


def engine_maps(modules: dict[str, str]) -> list[str]:
    """Every dict literal naming two or more of the ZeRO stages' engines: a map from a stage to
    its engine (``minipar.zero.STAGES`` is the one)."""
    found = []
    for mod, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Dict):
                named = {v.id for v in node.values if isinstance(v, ast.Name)} & ENGINES
                if len(named) >= 2:
                    found.append(f"{mod}:{node.lineno}")
    return found


def precision_lists(modules: dict[str, str]) -> list[str]:
    """Every tuple, list or set literal of three or more precision names (the one is
    ``minipar.mixed_precision.PRECISIONS``), and every module-level ``MASTER`` (the one master dtype)."""
    found = []
    for mod, source in modules.items():
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)} & set(PRECISIONS)
                if len(names) >= 3:
                    found.append(f"{mod}:{node.lineno}: a list of precisions")
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MASTER" for t in node.targets):
                found.append(f"{mod}:{node.lineno}: MASTER")
    return found


def flag_defaults(modules: dict[str, str]) -> list[str]:
    """Every ``add_argument`` of a flag made from a TrainConfig field (``minipar.cli.train.FLAGS``)
    written out by hand on ``minipar train``'s or ``minipar bench train``'s parser: its default and
    help would be a second copy of the field's. (Other verbs' flags of the same name, ``bench gpu
    --batch`` say, are other quantities.)"""
    field_flags = {flag for flag, _, _ in FLAGS}
    tree = ast.parse(modules["minipar.cli.train"])
    found = []
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        parsers = {fn.args.args[0].arg: field_flags} if fn.name == "add_grid_options" else {}
        for node in ast.walk(fn):  # the names bound to a parser of the verb "train" (bench train's --steps is its own)
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args
                    and getattr(node.value.func, "attr", None) == "add_parser"
                    and getattr(node.value.args[0], "value", None) == "train"):
                bench = getattr(node.value.func.value, "attr", None) == "bench"
                parsers.update({t.id: field_flags - {"--steps"} if bench else field_flags for t in node.targets})
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args
                    and getattr(node.args[0], "value", None) in parsers.get(getattr(node.func.value, "id", None), ())):
                found.append(f"minipar.cli.train:{node.lineno}: {node.args[0].value}")
    return found


def test_one_map_from_a_zero_stage_to_its_engine():
    assert engine_maps(read_tree()) == [f"minipar.zero:{_line('minipar.zero', 'STAGES = {')}"]
    assert STAGES[0].__name__ == "DDP" and sorted(STAGES) == [0, 1, 2, 3]


def test_a_second_map_is_caught():
    modules = read_tree()
    modules["minipar.train.trainer"] += "\n\nENGINE = {0: DDP, 1: ZeRO1, 2: ZeRO2, 3: ZeRO3}\n"
    assert len(engine_maps(modules)) == 2 and any("minipar.train.trainer" in p for p in engine_maps(modules))


def test_one_list_of_precisions_and_one_master_dtype():
    found = precision_lists(read_tree())
    assert [p.split(":")[0] for p in found] == ["minipar.mixed_precision"] * 2, found
    assert MASTER == "float32" and PRECISIONS == ("fp64", "fp32", "bf16", "fp16")


def test_a_second_list_of_precisions_is_caught():
    modules = read_tree()
    modules["minipar.figures.train_features"] += '\n\nPRECISIONS = ("fp64", "fp32", "bf16", "fp16")\n'
    modules["minipar.train.precision"] += '\n\nMASTER = {"bf16": "float32"}\n'
    found = precision_lists(modules)
    assert any("train_features" in p for p in found) and any("minipar.train.precision" in p and "MASTER" in p
                                                               for p in found), found


def test_the_flags_of_minipar_train_are_made_from_the_config():
    assert flag_defaults(read_tree()) == []
    from minipar.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["train"])
    # not one flag given: the run is TrainConfig's defaults, on the documented model and the sorting task
    assert config_from(args) == TrainConfig(GPTConfig(**DEFAULT_MODEL), data="sorting")
    train = next(a for a in parser._subparsers._group_actions if a.choices and "train" in a.choices).choices["train"]
    actions = {a.option_strings[0]: a for a in train._actions if a.option_strings}
    for flag, name, options in FLAGS:
        assert actions[flag].default == flag_default(name, options) or actions[flag].const is True, flag
        text = field_of(name).metadata.get("help")
        assert actions[flag].help == (text.format(default=shown(default_of(name))) if text else None), flag


def test_a_flag_written_out_by_hand_is_caught():
    modules = read_tree()
    source = modules["minipar.cli.train"]
    assert "    add_train_flag(t, *STEPS_FLAG)\n" in source
    modules["minipar.cli.train"] = source.replace("    add_train_flag(t, *STEPS_FLAG)\n", '    t.add_argument("--steps", type=int, '
                                                  'default=300, help="train until this step (default 300)")\n')
    found = flag_defaults(modules)
    assert len(found) == 1 and found[0].endswith(": --steps"), found


def _line(mod, text) -> int:
    return next(i for i, line in enumerate(read_tree()[mod].splitlines(), 1) if text in line)
