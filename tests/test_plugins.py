"""The plugin loader (commbench.core.plugins) and the registries it fills (commbench.core.registry), from outside
the tree: a ``--plugin`` module written here registers a toy codec that a real 2-rank run uses in its spawned ranks
(and the DDP hook accepts with no other edit), a fake installed distribution's entry point is loaded, and a module
that cannot be imported is one line and exit 2. The expected numbers come from the toy's own definition (bfloat16
bytes, no scales), not from commbench's output."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import commbench
from commbench.core.registry import OptionRegistry, Registry, lookup
from tests.cli_util import FAST
from tests.cli_util import commbench as run_cli

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[1]

TOY_PLUGIN = '''
"""A toy codec plugin: float32 carried as bfloat16 bytes, no scales (tests/test_plugins.py)."""
import os

from commbench.measure.codec import Codec, register_codec

if os.environ.get("TOY_PLUGIN_LOG"):  # one line per import: the loader imports a plugin once per process
    with open(os.environ["TOY_PLUGIN_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")


class ToyBf16(Codec):
    name = "toy_bf16"
    description = "fp32 as bfloat16 bytes, no scales (test plugin)"

    def code_bytes(self, numel):
        return 2 * numel

    def num_scales(self, numel):
        return 0

    def encode(self, x, codes, scales):
        import torch

        codes.view(torch.bfloat16).copy_(x)

    def decode(self, codes, scales, out, accumulate=False):
        import torch

        v = codes.view(torch.bfloat16)
        out.add_(v) if accumulate else out.copy_(v)

    def error_bound(self, abs_sum, contributions, encodings):
        import torch

        # one bfloat16 rounding (2**-8 relative) per encoding, plus the float32 sum
        return torch.as_tensor(abs_sum, dtype=torch.float64) * (encodings * 2.0**-8 + contributions * 2.0**-23)


def _toy(option):
    if option is not None:
        raise ValueError(f"toy_bf16 takes no option, got {option!r}")
    return ToyBf16()


register_codec("toy_bf16", _toy, impl="toy_bytes")
'''


def _env(path: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh interpreter that finds the files in ``path`` (and this checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COMMBENCH_PLUGINS", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(path), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _python(code: str, path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=path, env=_env(path, **extra), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture()
def toy_plugin(tmp_path: Path) -> Path:
    (tmp_path / "toy_codec_plugin.py").write_text(TOY_PLUGIN)
    return tmp_path


# --------------------------------------------------------------------------------------------- the loader


def test_loader_is_idempotent(toy_plugin: Path) -> None:
    log = toy_plugin / "imports.log"
    r = _python(
        """
        from commbench.core import plugins
        plugins.request(["toy_codec_plugin"])
        first = plugins.load()
        again = plugins.load()
        plugins.request(["toy_codec_plugin"])  # asked twice: still one module, one import
        for kind in plugins.KINDS:
            plugins.load(kind=kind)
        names = [p.name for p in plugins.loaded()]
        assert first == again == plugins.loaded(), (first, again)
        assert len(names) == len(set(names)), names
        assert set(plugins.BUILTINS) <= set(names)
        assert [p.source for p in plugins.loaded() if p.name == "toy_codec_plugin"] == ["--plugin"]
        from commbench.measure.precision import get_precision
        print(get_precision("toy_bf16").impl)
        """,
        toy_plugin,
        TOY_PLUGIN_LOG=str(log),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["toy_bytes"]
    assert len(log.read_text().split()) == 1


def test_a_registry_loads_only_the_builtins_of_its_kind(tmp_path: Path) -> None:
    """Listing precisions imports the codec modules, not the training models (torch) nor the figures."""
    r = _python(
        """
        import sys
        from commbench.measure.precision import precision_names
        names = precision_names()
        assert "fp8_e4m3" in names and "fp32_chunked" in names, names
        print("torch" in sys.modules, "commbench.training.models" in sys.modules, "matplotlib" in sys.modules)
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "False"]



def test_a_builtin_imported_first_keeps_the_listed_order(tmp_path: Path) -> None:
    """A policy module imported directly, before any lookup (a test importing `training.float8`, which imports
    `tensor_parallel`): its registration looks the registry up, and the modules listed after it load after it, so the
    policies come in the order of a plain load."""
    r = _python(
        """
        import json, sys
        import commbench.training.policies as p
        print(json.dumps(p.list_policies()))
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    want = r.stdout.split("\n")[-2]
    for first in ("commbench.training.float8", "commbench.training.tensor_parallel", "commbench.training.tp_pp_dp"):
        code = f"import json, {first}\nfrom commbench.training.policies import list_policies\nprint(json.dumps(list_policies()))"
        got = _python(code, tmp_path)
        assert got.returncode == 0, got.stderr
        assert got.stdout.split("\n")[-2] == want, first

def test_one_codec_registration_is_a_precision_and_a_ddp_hook(toy_plugin: Path) -> None:
    r = _python(
        """
        from commbench.core import plugins
        plugins.request(["toy_codec_plugin"])
        from commbench.measure.codec import codec_names, get_codec
        from commbench.measure.precision import get_precision, precision_names
        from commbench.training.hooks import codec_hook, codec_hook_bytes
        assert "toy_bf16" in codec_names() and "toy_bf16" in precision_names()
        assert get_codec("toy_bf16").code_bytes(10) == 20
        assert callable(codec_hook("toy_bf16"))
        print(get_precision("toy_bf16").impl, codec_hook_bytes("toy_bf16", [1000], 2))
        """,
        toy_plugin,
    )
    assert r.returncode == 0, r.stderr
    impl, _, formula = r.stdout.strip().partition(" ")
    assert impl == "toy_bytes"
    # all_to_all then all_gather of 2 chunks of 500 elements at 2 bytes, (n-1)/n of each on the bus; no scales
    assert ast.literal_eval(formula) == pytest.approx({"all_to_all:uint8": 0.5 * 2000, "all_gather:uint8": 0.5 * 2000})


def test_entry_point_of_an_installed_distribution_is_loaded(tmp_path: Path) -> None:
    """A fake installed distribution (a dist-info directory on the path) with two entry points of the group
    commbench.plugins: a module that registers at import, and a callable that registers when called."""
    dist = tmp_path / "toy_dist-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-dist\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[commbench.plugins]\ncodec = toy_codec_plugin\nbroadcast = toy_collective_plugin:register\n"
    )
    (tmp_path / "toy_codec_plugin.py").write_text(TOY_PLUGIN)
    (tmp_path / "toy_collective_plugin.py").write_text(
        textwrap.dedent(
            '''
            from commbench.measure.collectives import AllGather, register_collective


            class ToyBroadcast(AllGather):
                name = "toy_broadcast"
                size_convention = "buffer"
                order = 50

                def bus_factor(self, n):
                    return 1.0

                @property
                def bus_factor_formula(self):
                    return "1"


            def register():
                register_collective(ToyBroadcast())
            '''
        )
    )
    r = run_cli("list", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "  toy_broadcast    buffer; 1" in lines
    assert any(line.split()[:2] == ["toy_bf16", "toy_bytes"] for line in lines), r.stdout
    section = lines[lines.index("plugins:") + 1 :]
    assert [line.split()[:3] for line in section] == [
        ["codec", "=", "toy_codec_plugin"],
        ["broadcast", "=", "toy_collective_plugin:register"],
    ]
    assert all(line.endswith("entry point toy-dist") for line in section), section


def test_list_names_no_plugin_section_without_plugins(tmp_path: Path) -> None:
    r = run_cli("list", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "plugins:" not in r.stdout


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_plugin_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path: Path, where: str) -> None:
    args = ["--plugin", "no_such_module", "list"] if where == "before" else ["list", "--plugin", "no_such_module"]
    r = run_cli(*args, cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no_such_module" in r.stderr and "ModuleNotFoundError" in r.stderr


def test_a_plugin_that_raises_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('half-written plugin')\n")
    r = run_cli("--plugin", "broken_plugin", "list", cwd=tmp_path, env=_env(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "commbench: error: cannot load plugin 'broken_plugin' (--plugin): RuntimeError: half-written plugin"
    ]


def test_plugin_codec_runs_in_the_spawned_ranks(toy_plugin: Path) -> None:
    """``--plugin`` before the sub-command; ranks started as fresh interpreters (``COMMBENCH_SPAWN=exec``, as under
    torchrun) load it too, through COMMBENCH_PLUGINS (forked ranks inherit it loaded)."""
    log = toy_plugin / "imports.log"
    out = toy_plugin / "run"
    r = run_cli(
        "--plugin", "toy_codec_plugin", "run", "--collectives", "all_reduce", "--precisions", "fp32,toy_bf16",
        "-b", "1K", "-e", "4K", "-f", "4", "--nproc", "2", "--out", str(out), *FAST,
        cwd=toy_plugin, env=_env(toy_plugin, TOY_PLUGIN_LOG=str(log), COMMBENCH_SPAWN="exec"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    pids = log.read_text().split()
    assert len(pids) == len(set(pids)) == 3  # the supervisor and both ranks, each once
    df = commbench.load(out)
    toy = df[df["precision"] == "toy_bf16"]
    assert sorted(toy["fp32_bytes"]) == [1024, 4096]
    assert (toy["collective"] == "all_reduce").all() and (toy["impl"] == "toy_bytes").all()
    assert (toy["wrong"] == 0).all()  # the check inputs (<= 3 significant bits, sums of two) are exact in bf16
    # the chunked all_reduce gathers n chunks of N/n elements at 2 bytes each: half the fp32 bytes on the wire
    assert (toy["wire_bytes"] == toy["fp32_bytes"] // 2).all()


# ------------------------------------------------------------------------------------------- the registries


def test_registry_names_values_and_errors() -> None:
    reg: Registry[int] = Registry("toy number (test_plugins)", builtins=False)
    reg.register("one", 1)
    reg.register("two", 2)
    assert reg.names() == ["one", "two"] and reg.values() == [1, 2] and list(reg) == ["one", "two"]
    assert reg["two"] == 2 and "one" in reg and "three" not in reg and len(reg) == 2
    assert reg.get("three", None) is None
    with pytest.raises(ValueError, match=r"^unknown toy number \(test_plugins\) 'three'; valid choices: one, two$"):
        reg.get("three")
    with pytest.raises(ValueError, match="already registered"):
        reg.register("one", 11)
    reg["one"] = 11  # what monkeypatch.setitem does
    assert reg["one"] == 11
    del reg["one"]
    assert reg.names() == ["two"]
    assert lookup("toy number (test_plugins)", "two") == 2
    with pytest.raises(ValueError, match="unknown registry 'no such kind'"):
        lookup("no such kind", "x")


def test_option_registry_builds_names_with_options() -> None:
    reg: OptionRegistry[tuple[str, str | None]] = OptionRegistry("toy family (test_plugins)", builtins=False)
    reg.register_family("scaled", lambda option: ("scaled", option), "tensor | block<N>")
    reg.register("plain", ("plain", None))
    assert reg.names() == ["scaled", "plain"]
    assert reg.get("scaled:block32") == ("scaled", "block32") and reg.get("scaled") == ("scaled", None)
    assert reg.items() == [("scaled", ("scaled", None)), ("plain", ("plain", None))]
    assert reg.options_help() == {"scaled": "tensor | block<N>", "plain": ""}
    assert "scaled:x" in reg and "plain:x" not in reg and "other" not in reg
    with pytest.raises(ValueError, match=r"^unknown toy family \(test_plugins\) 'other:x'; valid choices: scaled, plain$"):
        reg.get("other:x")
    with pytest.raises(ValueError, match="has an empty option after ':'"):
        reg.get("scaled:")
    with pytest.raises(ValueError, match=r"^toy family \(test_plugins\) 'plain' takes no ':x' option$"):
        reg.get("plain:x")
    with pytest.raises(ValueError, match="without ':'"):
        reg.register_family("a:b", lambda option: ("a", option))
