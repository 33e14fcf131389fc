"""cptkit merge: the methods on planted tensors (hand-computed), and the step on tiny Llamas built here:
alpha = 0 is the base and alpha = 1 the model tensor for tensor (through a -m sweep), the model card,
the refusals, and resume keyed to both parents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_main
from safetensors.torch import load_file

from cptkit.models.merge import merge_tensor, tensor_seed

B = torch.tensor([1.0, 2.0, 3.0, 4.0])
M = torch.tensor([2.0, 0.0, 3.5, 10.0])  # task vector M - B = [1, -2, 0.5, 6]


# -- the methods on planted tensors ------------------------------------------------------------

def test_linear_planted() -> None:
    assert torch.equal(merge_tensor("w", B, M, "linear", 0.25), torch.tensor([1.25, 1.5, 3.125, 5.5]))
    assert torch.equal(merge_tensor("w", B, M, "linear", 0.0), B)
    assert torch.equal(merge_tensor("w", B, M, "linear", 1.0), M)


def test_ties_planted() -> None:
    # density 0.5 keeps the 2 largest |tau| of 4: -2 and 6; B + 0.5 * [0, -2, 0, 6]
    assert torch.equal(merge_tensor("w", B, M, "ties", 0.5, density=0.5), torch.tensor([1.0, 1.0, 3.0, 7.0]))
    # density 0.25: one entry (6); alpha 1: B + [0, 0, 0, 6]
    assert torch.equal(merge_tensor("w", B, M, "ties", 1.0, density=0.25), torch.tensor([1.0, 2.0, 3.0, 10.0]))
    assert torch.equal(merge_tensor("w", B, M, "ties", 0.0, density=0.5), B)


def test_ties_sign_election_is_the_papers() -> None:
    """mergekit's TIES (what merge_tensor calls) elects signs as Yadav et al.: per entry the sign of
    the summed task vectors, then the mean of the agreeing ones (a zero entry never agrees)."""
    from mergekit.merge_methods import merge_tensors

    base = torch.zeros(4)
    m1, m2 = torch.tensor([3.0, -1.0, 2.0, 0.0]), torch.tensor([-1.0, -2.0, 1.0, 4.0])
    # sums [2, -3, 3, 4] -> signs +, -, +, +; agreeing means: [3], [-1, -2], [2, 1], [4]
    out = merge_tensors([base, m1, m2], "ties", ids=("b", "m1", "m2"), base_index=0,
                        parameters={"weight": {"m1": 1.0, "m2": 1.0}, "density": {"m1": 1.0, "m2": 1.0}})
    assert torch.equal(out, torch.tensor([3.0, -1.5, 1.5, 4.0]))


def test_dare_planted() -> None:
    """Every entry of tau is dropped (0) or kept as alpha * tau / (1 - drop), with the drops of the
    tensor's own seeded generator: Yu et al.'s rescale, not mergekit's L1 one."""
    n = 20_000
    base = torch.linspace(-1, 1, n)
    model = base + torch.linspace(0.5, 2.0, n)  # tau > 0 everywhere
    tau = model - base
    out = merge_tensor("layer.w", base, model, "dare", 0.5, drop=0.75, seed=7)
    keep = torch.bernoulli(torch.full((n,), 0.25), generator=torch.Generator().manual_seed(tensor_seed(7, "layer.w")))
    expected = base + (tau * keep) * (0.5 / 0.25)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    kept = (out - base).abs() > 1e-3
    assert abs(kept.float().mean().item() - 0.25) < 0.02  # a quarter kept
    torch.testing.assert_close((out - base)[kept], 2.0 * tau[kept], rtol=1e-5, atol=1e-5)  # alpha/(1-p) = 2
    assert torch.equal(merge_tensor("layer.w", base, model, "dare", 0.5, drop=0.75, seed=7), out)  # seeded
    assert not torch.equal(merge_tensor("layer.w", base, model, "dare", 0.5, drop=0.75, seed=8), out)
    assert not torch.equal(merge_tensor("layer.v", base, model, "dare", 0.5, drop=0.75, seed=7), out)
    assert torch.equal(merge_tensor("layer.w", base, model, "dare", 0.0, drop=0.75, seed=7), base)


# -- the step on tiny Llamas ---------------------------------------------------------------------

TEXTS = ["The capital of France is Paris. Paris is a large city on the Seine.",
         "Newton's second law states that force equals mass times acceleration.",
         "Chemistry describes reactions between atoms. Water is made of hydrogen and oxygen."] * 4
OTHER = ["Zebras graze quietly; yaks wander over vast Xinjiang plains. Quixotic jokes!",
         "Vexing kumquats puzzle jovial wizards; fizzy bubbles hop." ] * 4


def save_tiny(d: Path, texts: list[str], seed: int, hidden: int = 32) -> Path:
    from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer

    tok = train_bpe_tokenizer(texts, vocab_size=280, min_frequency=1)
    assert len(tok) == 280
    tiny_llama(tok, hidden=hidden, layers=1, heads=2, max_position=64, seed=seed).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def parents(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("parents")
    return save_tiny(d / "base", TEXTS, seed=0), save_tiny(d / "model", TEXTS, seed=1)


def cli(argv: list, capsys) -> tuple[int, str]:
    capsys.readouterr()  # what the test printed before (saving a model)
    code = run_main(["merge", *map(str, argv)])
    return code, capsys.readouterr().err


def one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def test_sweep_alpha_0_is_base_and_1_is_model(parents, tmp_path, capsys) -> None:
    base, model = parents
    code, err = cli(["--base", base, "--model", model, "--out", tmp_path / "m{merge.alpha}", "-q",
                     "-m", "merge.alpha=0.0,1.0,0.5", f"hydra.sweep.dir={tmp_path / 'sweep'}"], capsys)
    assert code == 0, err
    wb, wm = weights(base), weights(model)
    w0, w1, wh = (weights(tmp_path / f"m{a}") for a in ("0.0", "1.0", "0.5"))
    assert sorted(w0) == sorted(wb) == sorted(w1)
    assert all(torch.equal(w0[k], wb[k]) for k in wb)
    assert all(torch.equal(w1[k], wm[k]) for k in wm)
    assert any(not torch.equal(wb[k], wm[k]) for k in wb)  # the parents differ: the check means something
    k = "model.layers.0.mlp.down_proj.weight"
    torch.testing.assert_close(wh[k], 0.5 * wb[k] + 0.5 * wm[k])
    for a in ("0.0", "1.0", "0.5"):  # a finished HF folder: the model's tokenizer, byte for byte
        out = tmp_path / f"m{a}"
        assert (out / "_SUCCESS").is_file() and (out / "config.json").is_file()
        assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
        manifest = json.loads((out / "_manifest.json").read_text())
        assert manifest["config"]["merge"]["alpha"] == float(a)
        assert "model.safetensors" in manifest["files"]
    from cptkit.models.lm import load_causal_lm

    lm = load_causal_lm(str(tmp_path / "m1.0"))
    assert torch.equal(lm.state_dict()[k], wm[k])


def card(d: Path) -> tuple[dict, str]:
    text = (d / "README.md").read_text()
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def test_card_names_both_parents_and_method(parents, tmp_path, capsys) -> None:
    from cptkit.core.fingerprint import fingerprint_path

    base, model = parents
    out = tmp_path / "ties"
    code, err = cli(["--base", base, "--model", model, "--out", out, "-q", "merge.method=ties",
                     "merge.alpha=0.3", "merge.density=0.4"], capsys)
    assert code == 0, err
    front, body = card(out)
    assert front["base_model"] == [str(base), str(model)] and front["base_model_relation"] == "merge"
    for p in (base, model):
        fp = fingerprint_path(p)
        assert fp["sha256"] in body and fp["path"] in body
    assert "| method | ties |" in body and "| alpha | 0.3 |" in body and "| density | 0.4 |" in body
    assert "merge.method=ties merge.alpha=0.3 merge.density=0.4" in body
    # ties at density 0.4: at most 40% of each tensor moved off the base
    wb, wo = weights(base), weights(out)
    moved = (wo["model.layers.0.mlp.up_proj.weight"] != wb["model.layers.0.mlp.up_proj.weight"]).float().mean()
    assert 0.3 < moved.item() <= 0.4


def test_dare_is_seeded(parents, tmp_path, capsys) -> None:
    base, model = parents
    outs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        code, err = cli(["--base", base, "--model", model, "--out", tmp_path / name, "-q", "merge.method=dare",
                         "merge.alpha=1.0", "merge.drop=0.5", f"seed={seed}"], capsys)
        assert code == 0, err
        outs.append(weights(tmp_path / name))
    k = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(outs[0][k], outs[1][k]) and not torch.equal(outs[0][k], outs[2][k])
    assert "| seed | 3 |" in card(tmp_path / "a")[1]


@pytest.mark.parametrize("override, why", [
    ("merge.alpha=1.5", "merge.alpha=1.5: must be in [0, 1]"),
    ("merge.alpha=-0.1", "merge.alpha=-0.1: must be in [0, 1]"),
    ("merge.method=slerp", "merge.method=slerp: must be one of linear, ties, dare"),
])
def test_refuses_bad_settings(parents, tmp_path, capsys, override, why) -> None:
    base, model = parents
    code, err = cli(["--base", base, "--model", model, "--out", tmp_path / "o", override], capsys)
    assert code == 2 and why in one_error(err)
    assert not (tmp_path / "o").exists()


def test_refuses_other_architecture_or_vocabulary(parents, tmp_path, capsys) -> None:
    base, _ = parents
    wide = save_tiny(tmp_path / "wide", TEXTS, seed=1, hidden=48)
    code, err = cli(["--base", base, "--model", wide, "--out", tmp_path / "o1"], capsys)
    assert code == 2
    assert "are different architectures: config hidden_size 32 vs 48" in one_error(err)
    assert not (tmp_path / "o1").exists()
    other = save_tiny(tmp_path / "other", OTHER, seed=1)  # same shapes, another vocabulary
    code, err = cli(["--base", base, "--model", other, "--out", tmp_path / "o2"], capsys)
    assert code == 2 and "different tokenizer vocabularies (280 vs 280 tokens" in one_error(err)
    assert not (tmp_path / "o2").exists()
    code, err = cli(["--base", base, "--out", tmp_path / "o3"], capsys)
    assert code == 2 and "--model is required" in one_error(err)


def test_refuses_a_folder_that_would_run_its_code(parents, tmp_path, capsys) -> None:
    base, model = parents
    evil = tmp_path / "evil"
    shutil.copytree(model, evil)
    cfg = json.loads((evil / "config.json").read_text())
    (evil / "config.json").write_text(json.dumps(cfg | {"auto_map": {"AutoModelForCausalLM": "evil.Evil"}}))
    code, err = cli(["--base", base, "--model", evil, "--out", tmp_path / "o"], capsys)
    assert code == 2
    assert f"model folder {evil}: config.json names code shipped in the folder" in one_error(err)
    assert "cptkit does not run a model folder's code here" in err
    assert not (tmp_path / "o").exists()


def test_refuses_another_tensor_set(parents, tmp_path) -> None:
    """A parent with tensors the other lacks (biases that no ARCH_KEYS names) is refused after loading."""
    from transformers import LlamaForCausalLM

    from cptkit.core.errors import CptkitError
    from cptkit.models.lm import load_causal_lm
    from cptkit.models.merge import check_parents

    base = load_causal_lm(str(parents[0]))
    cfg = base.config.to_dict() | {"attention_bias": True}
    biased = LlamaForCausalLM(type(base.config).from_dict(cfg))
    with pytest.raises(CptkitError, match="tensor model.layers.0.self_attn.k_proj.bias is only in model"):
        check_parents(base, biased)


def test_resume_and_changed_parent_refuses(parents, tmp_path, capsys) -> None:
    base0, model = parents
    base = tmp_path / "base"
    shutil.copytree(base0, base)
    out = tmp_path / "m"
    argv = ["--base", base, "--model", model, "--out", out, "merge.alpha=0.5"]
    assert cli(argv, capsys)[0] == 0
    st = (out / "model.safetensors").stat()
    code, err = cli(argv, capsys)
    assert code == 0 and "nothing to do" in err
    assert (out / "model.safetensors").stat().st_mtime_ns == st.st_mtime_ns  # not merged again
    save_tiny(base, TEXTS, seed=5)  # the base replaced in place
    code, err = cli(argv, capsys)
    assert code == 2
    assert "is a finished output of inputs that changed since" in one_error(err) and "base" in err


def test_staged_files_arrive_whole_or_not_at_all(tmp_path) -> None:
    """core.shards.staged: what save_pretrained writes is renamed into the output when the block ends;
    a failed block leaves nothing, and a staged folder of a process that is gone is removed."""
    from cptkit.core.errors import CptkitError
    from cptkit.core.shards import staged

    dead = tmp_path / ".staged.tmp-999999999"
    dead.mkdir()
    (dead / "half.bin").write_bytes(b"x")
    with pytest.raises(RuntimeError), staged(tmp_path) as tmp:
        (tmp / "a.bin").write_bytes(b"a")
        raise RuntimeError("killed mid-save")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with staged(tmp_path) as tmp:
        (tmp / "a.bin").write_bytes(b"a")
        (tmp / "config.json").write_text("{}")
        assert not (tmp_path / "a.bin").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "config.json"]
    with pytest.raises(CptkitError, match="plain files only"), staged(tmp_path / "o") as tmp:
        (tmp / "sub").mkdir()
    assert not any(p.name.startswith(".staged") for p in (tmp_path / "o").iterdir())


def test_card_names_the_shipped_model_by_its_hub_id() -> None:
    from cptkit.core.config import compose_step
    from cptkit.core.discovery import step_module

    step_module("merge")
    from omegaconf import OmegaConf

    from cptkit.steps.merge import model_card

    conf = OmegaConf.to_object(compose_step("merge", ["merge.base=smollm2", "merge.model=runs/m/model"]))
    parents = {r: {"spec": s, "path": f"/abs/{s}", "sha256": "ab" * 32, "size": 1} for r, s in
               (("base", "smollm2"), ("model", "runs/m/model"))}
    front = yaml.safe_load(model_card(conf, parents, 10).split("---\n")[1])
    assert front["base_model"] == ["HuggingFaceTB/SmolLM2-135M-Instruct", "runs/m/model"]


def test_tied_embeddings_are_merged_once() -> None:
    """A tied output layer shares the embedding's storage: merging it as a second tensor would merge
    the embedding twice."""
    from cptkit.models.merge import merge_into
    from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer

    tok = train_bpe_tokenizer(TEXTS, vocab_size=280, min_frequency=1)
    base, model = (tiny_llama(tok, hidden=16, layers=1, heads=2, seed=s, tie_embeddings=True) for s in (0, 1))
    b, m = base.model.embed_tokens.weight.detach().clone(), model.model.embed_tokens.weight.detach().clone()
    merge_into(base, model, "linear", 0.5)
    torch.testing.assert_close(model.model.embed_tokens.weight.detach(), 0.5 * b + 0.5 * m)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
